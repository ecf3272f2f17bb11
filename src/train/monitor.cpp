#include "train/monitor.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <set>

namespace myriad::train {

double quantile(std::vector<double> v, double p) {
  if (v.empty()) return std::nan("");
  std::sort(v.begin(), v.end());
  const double pos = std::clamp(p, 0.0, 1.0) * static_cast<double>(v.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - static_cast<double>(lo)) * (v[hi] - v[lo]);
}

double EmaStats::z(double x) const {
  const double s = std();
  // σ at rounding level (a constant series) carries no scale: no outliers then.
  return n_ >= 2 && s > 1e-12 * (1 + std::abs(mean())) ? (x - mean()) / s : 0.0;
}

// Bias-corrected as in Adam: with raw EMAs started at 0 the first estimates are plain averages
// (an uncorrected σ² = 0.01 d² after two values would flag every early step as a spike).
double EmaStats::mean() const {
  return n_ ? mu_ / (1 - std::pow(rho_, double(n_))) : 0.0;
}

double EmaStats::std() const {
  return n_ >= 2 ? std::sqrt(var_ / (1 - std::pow(rho_, double(n_ - 1)))) : 0.0;
}

void EmaStats::push(double x) {
  if (n_ > 0) {
    const double d = x - mean();
    var_ = rho_ * var_ + (1 - rho_) * d * d;
  }
  mu_ = rho_ * mu_ + (1 - rho_) * x;
  ++n_;
}

nlohmann::json EmaStats::state() const {
  return {{"rho", rho_}, {"mu", mu_}, {"var", var_}, {"n", n_}};
}

void EmaStats::load_state(const nlohmann::json& j) {
  rho_ = j.at("rho").get<double>();
  mu_ = j.at("mu").get<double>();
  var_ = j.at("var").get<double>();
  n_ = j.at("n").get<int64_t>();
}

namespace {

double mean_of(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  const double mu = mean_of(v);
  double s = 0;
  for (double x : v) s += (x - mu) * (x - mu);
  return std::sqrt(s / static_cast<double>(v.size()));
}

void push_window(std::deque<double>& d, double x, int64_t window) {
  d.push_back(x);
  while (static_cast<int64_t>(d.size()) > window) d.pop_front();
}

double median(const std::deque<double>& d) {
  return quantile({d.begin(), d.end()}, 0.5);
}

double entropy(const double* p, int64_t n) {
  double h = 0;
  for (int64_t j = 0; j < n; ++j)
    if (p[j] > 0) h -= p[j] * std::log(p[j]);
  return h;
}

}  // namespace

Decision Monitor::decide(double loss, double grad_norm) {
  const bool bad = !std::isfinite(loss) || !std::isfinite(grad_norm) || loss_ema_.z(loss) > 6;
  if (!bad) {
    consecutive_ = 0;
    return Decision::Apply;
  }
  ++skips_;
  if (++consecutive_ < 3) return Decision::Skip;
  consecutive_ = 0;
  ++rollbacks_;
  return Decision::Rollback;
}

double Monitor::probe(int64_t layer, const Tensor& selected_Nk) {
  MYRIAD_CHECK(selected_Nk.dim() == 2, "monitor: probe selection must be [N, k], got ",
               shape_str(selected_Nk.shape()));
  LayerState& L = layers_[layer];
  std::vector<int64_t> sel = selected_Nk.to_ints();
  const int64_t N = selected_Nk.size(0), k = selected_Nk.size(1);
  double flips = 0;
  if (L.probed) {
    MYRIAD_CHECK(L.probe.size() == sel.size(), "monitor: probe batch of layer ", layer,
                 " changed shape to ", shape_str(selected_Nk.shape()));
    for (int64_t i = 0; i < N; ++i) {
      const std::set<int64_t> prev(L.probe.begin() + i * k, L.probe.begin() + (i + 1) * k);
      for (int64_t s = 0; s < k; ++s) flips += prev.count(sel[i * k + s]) ? 0.0 : 1.0;
    }
    flips /= static_cast<double>(N * k);
  }
  L.probe = std::move(sel);
  L.probed = true;
  L.flip_rate = flips;
  return flips;
}

void Monitor::grad_stats(const std::string& p, double g, std::map<std::string, double>& out) {
  EmaStats& e = grad_ema_.try_emplace(p).first->second;
  std::deque<double>& h = grad_hist_[p];
  int64_t& spikes = grad_spikes_[p];
  if (std::isfinite(g) && g > 0) {
    const double lg = std::log(g), J = std::abs(e.z(lg));
    if (J > 4 || (!h.empty() && g > 3 * median(h))) ++spikes;
    out[p + "jitter"] = J;
    e.push(lg);
    push_window(h, g, window_);
  }
  out[p + "norm"] = g;
  if (!h.empty()) {
    const std::vector<double> v(h.begin(), h.end());
    out[p + "cv100"] = std_of(v) / mean_of(v);
  }
  out[p + "spikes"] = static_cast<double>(spikes);
}

std::map<std::string, double> Monitor::step(const StepStats& s) {
  std::map<std::string, double> out;
  // Loss spikes: z against the EMA that excludes this step.
  const double z = loss_ema_.z(s.loss);
  out["loss/value"] = s.loss;
  out["loss/z"] = z;
  if (std::isfinite(s.loss)) {
    if (z > 4 && !loss_hist_.empty() && s.loss > 1.1 * median(loss_hist_)) {
      ++loss_spikes_;
      spikes_.push_back({s.step, s.shard, s.sequence_ids, s.loss, z});
    }
    if (z <= 6) {  // skipped losses do not move the statistics
      loss_ema_.push(s.loss);
      push_window(loss_hist_, s.loss, window_);
    }
  }
  out["loss/spikes"] = static_cast<double>(loss_spikes_);
  out["loss/skips"] = static_cast<double>(skips_);
  out["loss/rollbacks"] = static_cast<double>(rollbacks_);

  grad_stats("grad/", s.grad_norm, out);
  for (const auto& [group, g] : s.group_norms) grad_stats("grad/" + group + "/", g, out);

  for (const LayerRouting& r : s.layers) {
    const std::string p = "layer" + std::to_string(r.layer) + "/";
    const auto n = static_cast<int64_t>(r.counts.size());
    MYRIAD_CHECK(n >= 2 && r.tokens > 0 && r.top_k >= 1, "monitor: layer ", r.layer,
                 " needs counts, tokens and top_k");
    LayerState& L = layers_[r.layer];
    if (L.last_active.empty()) L.last_active.assign(n, -1);
    const double q = static_cast<double>(r.tokens * r.top_k) / static_cast<double>(n);
    std::vector<double> rel(n), f(n);
    int64_t dead = 0;
    for (int64_t j = 0; j < n; ++j) {
      rel[j] = static_cast<double>(r.counts[j]) / q;
      f[j] = static_cast<double>(r.counts[j]) / static_cast<double>(r.tokens * r.top_k);
      if (r.counts[j] > 0) L.last_active[j] = t_;
      dead += L.last_active[j] <= t_ - window_ || L.last_active[j] < 0;
    }
    const double mx = *std::max_element(rel.begin(), rel.end());
    out[p + "load/max_over_mean"] = mx;
    out[p + "load/maxvio"] = mx - 1;
    out[p + "load/min_over_mean"] = *std::min_element(rel.begin(), rel.end());
    out[p + "load/cv"] = std_of(rel);
    for (int pc : {0, 1, 10, 50, 90, 99, 100})
      out[p + "load/q" + std::to_string(pc)] = quantile(rel, pc / 100.0);
    out[p + "load/dead"] = static_cast<double>(dead);
    out[p + "route/load_entropy"] = entropy(f.data(), n) / std::log(static_cast<double>(n));
    if (!r.bias.empty()) {
      out[p + "bias/min"] = *std::min_element(r.bias.begin(), r.bias.end());
      out[p + "bias/max"] = *std::max_element(r.bias.begin(), r.bias.end());
      out[p + "bias/std"] = std_of(r.bias);
    }
    if (r.scores_Nn.defined()) {
      MYRIAD_CHECK(r.scores_Nn.dim() == 2 && r.scores_Nn.size(1) == n, "monitor: layer ", r.layer,
                   " scores must be [N, ", n, "], got ", shape_str(r.scores_Nn.shape()));
      const int64_t N = r.scores_Nn.size(0);
      std::vector<double> sc = r.scores_Nn.to_doubles();
      double ht = 0, hs = 0;
      std::vector<double> pi;
      const std::vector<int64_t> sel =
          r.selected_Nk.defined() ? r.selected_Nk.to_ints() : std::vector<int64_t>{};
      const int64_t k = r.selected_Nk.defined() ? r.selected_Nk.size(1) : 0;
      for (int64_t t = 0; t < N; ++t) {
        double* row = &sc[t * n];
        if (k > 0) {  // π: the renormalised top-k weights
          pi.assign(k, 0.0);
          for (int64_t s2 = 0; s2 < k; ++s2) pi[s2] = row[sel[t * k + s2]];
          const double z2 = std::accumulate(pi.begin(), pi.end(), 0.0);
          for (double& x : pi) x /= z2;
          hs += entropy(pi.data(), k);
        }
        const double z1 = std::accumulate(row, row + n, 0.0);
        for (int64_t j = 0; j < n; ++j) row[j] /= z1;
        ht += entropy(row, n);
      }
      out[p + "route/token_entropy"] = ht / static_cast<double>(N) / std::log(double(n));
      if (k > 1)
        out[p + "route/selected_entropy"] = hs / static_cast<double>(N) / std::log(double(k));
    }
    if (L.probed) out[p + "route/flip_rate"] = L.flip_rate;
  }
  ++t_;
  return out;
}

}  // namespace myriad::train

namespace myriad::train {

nlohmann::json Monitor::state() const {
  using J = nlohmann::json;
  J grad = J::object();
  for (const auto& [p, e] : grad_ema_) {
    const auto h = grad_hist_.find(p);
    const auto sp = grad_spikes_.find(p);
    grad[p] = {{"ema", e.state()},
               {"hist", h == grad_hist_.end() ? J::array() : J(h->second)},
               {"spikes", sp == grad_spikes_.end() ? 0 : sp->second}};
  }
  J layers = J::array();
  for (const auto& [l, L] : layers_)
    layers.push_back({{"layer", l},
                      {"last_active", L.last_active},
                      {"probe", L.probe},
                      {"flip_rate", L.flip_rate},
                      {"probed", L.probed}});
  J spikes = J::array();
  for (const SpikeRecord& r : spikes_)
    spikes.push_back({{"step", r.step},
                      {"shard", r.shard},
                      {"sequence_ids", r.sequence_ids},
                      {"loss", r.loss},
                      {"z", r.z}});
  return {{"window", window_},
          {"t", t_},
          {"skips", skips_},
          {"rollbacks", rollbacks_},
          {"consecutive", consecutive_},
          {"loss_spikes", loss_spikes_},
          {"loss_ema", loss_ema_.state()},
          {"loss_hist", loss_hist_},
          {"grad", grad},
          {"layers", layers},
          {"spikes", spikes}};
}

void Monitor::load_state(const nlohmann::json& j) {
  window_ = j.at("window").get<int64_t>();
  t_ = j.at("t").get<int64_t>();
  skips_ = j.at("skips").get<int64_t>();
  rollbacks_ = j.at("rollbacks").get<int64_t>();
  consecutive_ = j.at("consecutive").get<int64_t>();
  loss_spikes_ = j.at("loss_spikes").get<int64_t>();
  loss_ema_.load_state(j.at("loss_ema"));
  loss_hist_ = j.at("loss_hist").get<std::deque<double>>();
  grad_ema_.clear();
  grad_hist_.clear();
  grad_spikes_.clear();
  for (const auto& [p, g] : j.at("grad").items()) {
    grad_ema_[p].load_state(g.at("ema"));
    grad_hist_[p] = g.at("hist").get<std::deque<double>>();
    grad_spikes_[p] = g.at("spikes").get<int64_t>();
  }
  layers_.clear();
  for (const auto& l : j.at("layers")) {
    LayerState& L = layers_[l.at("layer").get<int64_t>()];
    L.last_active = l.at("last_active").get<std::vector<int64_t>>();
    L.probe = l.at("probe").get<std::vector<int64_t>>();
    L.flip_rate = l.at("flip_rate").get<double>();
    L.probed = l.at("probed").get<bool>();
  }
  spikes_.clear();
  for (const auto& r : j.at("spikes"))
    spikes_.push_back({r.at("step").get<int64_t>(), r.at("shard").get<int64_t>(),
                       r.at("sequence_ids").get<std::vector<int64_t>>(), r.at("loss").get<double>(),
                       r.at("z").get<double>()});
}

}  // namespace myriad::train
