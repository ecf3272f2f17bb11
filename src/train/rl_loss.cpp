// Agentic-RL arithmetic (TRAINING.md §7.3-§7.6) on host vectors in double precision: group
// advantages with turn returns, GAE over the mask-1 positions only, and the policy loss (token or
// GSPO sequence ratio, clip-higher, dual clip, TIS, k3 KL, three aggregations) with its analytic
// gradient dL/dlogp. Mask-0 positions are never read (beyond the mask itself), so padding and
// garbage there change nothing.
#include "train/rl_loss.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <stdexcept>

#include "core/error.h"

namespace myriad::train::rl {

namespace {

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// The sample's turn index at t (-1 when the turn vector is empty: a sample without turns).
int32_t turn_at(const Sample& s, size_t t) {
  return s.turn.empty() ? -1 : s.turn[t];
}

void check_sample(const Sample& s, const char* fn, size_t i) {
  require(
      s.turn.empty() || s.turn.size() == s.mask.size(),
      cat(fn, ": sample ", i, " turn has ", s.turn.size(), " entries, mask has ", s.mask.size()));
}

// Population mean and std of xs (xs non-empty).
void mean_std(const std::vector<double>& xs, double& mean, double& sd) {
  double sum = 0;
  for (double x : xs) sum += x;
  mean = sum / static_cast<double>(xs.size());
  double var = 0;
  for (double x : xs) var += (x - mean) * (x - mean);
  sd = std::sqrt(var / static_cast<double>(xs.size()));
}

bool all_same(const std::vector<double>& xs) {
  for (double x : xs)
    if (x != xs.front()) return false;
  return true;
}

// Normalised deviations from the mean; exactly 0 when every value is equal.
std::vector<double> normalise(const std::vector<double>& xs, bool std_norm, double eps) {
  std::vector<double> out(xs.size(), 0.0);
  if (xs.empty() || all_same(xs)) return out;
  double mean = 0, sd = 0;
  mean_std(xs, mean, sd);
  for (size_t j = 0; j < xs.size(); ++j)
    out[j] = std_norm ? (xs[j] - mean) / (sd + eps) : xs[j] - mean;
  return out;
}

}  // namespace

GroupAdvantages group_advantages(const std::vector<Sample>& group, const AdvantageConfig& cfg) {
  require(cfg.eps >= 0, cat("adv.eps: must be >= 0, got ", cfg.eps));
  require(std::isfinite(cfg.lambda_process),
          cat("adv.lambda_process: must be finite, got ", cfg.lambda_process));
  require(std::isfinite(cfg.gamma_turn),
          cat("adv.gamma_turn: must be finite, got ", cfg.gamma_turn));
  for (size_t i = 0; i < group.size(); ++i) check_sample(group[i], "group_advantages", i);

  GroupAdvantages out;
  out.A.resize(group.size());
  for (size_t i = 0; i < group.size(); ++i) out.A[i].assign(group[i].mask.size(), 0.0);
  if (group.empty()) {
    out.all_equal = true;
    return out;
  }

  // All-equal check: every R equal and every turn reward of the group equal.
  bool equal = true;
  const double* first_turn = nullptr;
  for (const Sample& s : group) {
    if (s.R != group.front().R) equal = false;
    for (const double& r : s.r_turn) {
      if (!first_turn) first_turn = &r;
      if (r != *first_turn) equal = false;
    }
  }
  out.all_equal = equal;
  if (equal) return out;

  std::vector<double> R(group.size());
  for (size_t i = 0; i < group.size(); ++i) R[i] = group[i].R;
  const std::vector<double> a_out = normalise(R, cfg.std_norm, cfg.eps);

  // Turn returns G_ik = Σ_{k'≥k} γ^{k'-k} r_{i,k'}, pooled over all (i, k) of the group.
  std::vector<double> pool;
  std::vector<size_t> offset(group.size());
  for (size_t i = 0; i < group.size(); ++i) {
    offset[i] = pool.size();
    const std::vector<double>& r = group[i].r_turn;
    std::vector<double> G(r.size());
    double acc = 0;
    for (size_t k = r.size(); k-- > 0;) {
      acc = r[k] + cfg.gamma_turn * acc;
      G[k] = acc;
    }
    pool.insert(pool.end(), G.begin(), G.end());
  }
  const std::vector<double> a_turn = normalise(pool, cfg.std_norm, cfg.eps);

  for (size_t i = 0; i < group.size(); ++i) {
    const Sample& s = group[i];
    const size_t K = s.r_turn.size();
    for (size_t t = 0; t < s.mask.size(); ++t) {
      if (!s.mask[t]) continue;
      const int32_t k = turn_at(s, t);
      double a = a_out[i];
      if (k >= 0 && static_cast<size_t>(k) < K)
        a += cfg.lambda_process * a_turn[offset[i] + static_cast<size_t>(k)];
      out.A[i][t] = a;
    }
  }
  return out;
}

Gae gae(const Sample& s, const std::vector<double>& values, double gamma, double lambda,
        double bootstrap) {
  check_sample(s, "gae", 0);
  const size_t T = s.mask.size();
  require(values.size() == T,
          cat("gae: values has ", values.size(), " entries, the sample has ", T, " tokens"));
  Gae g;
  g.advantages.assign(T, 0.0);
  g.returns.assign(T, 0.0);

  std::vector<size_t> u;  // the mask-1 positions u_1 < ... < u_N
  for (size_t t = 0; t < T; ++t)
    if (s.mask[t]) u.push_back(t);
  if (u.empty()) return g;
  const size_t N = u.size();

  // Rewards on the steps: a turn's process reward on its last mask-1 token, R on u_N.
  std::vector<double> r(N, 0.0);
  std::vector<int64_t> last_step(s.r_turn.size(), -1);
  for (size_t n = 0; n < N; ++n) {
    const int32_t k = turn_at(s, u[n]);
    if (k >= 0 && static_cast<size_t>(k) < s.r_turn.size())
      last_step[static_cast<size_t>(k)] = static_cast<int64_t>(n);
  }
  for (size_t k = 0; k < s.r_turn.size(); ++k)
    if (last_step[k] >= 0) r[static_cast<size_t>(last_step[k])] += s.r_turn[k];
  r[N - 1] += s.R;

  double next_adv = 0;
  for (size_t n = N; n-- > 0;) {
    const double v = values[u[n]];
    const double v_next = n + 1 < N ? values[u[n + 1]] : bootstrap;
    const double delta = r[n] + gamma * v_next - v;
    const double adv = n + 1 < N ? delta + gamma * lambda * next_adv : delta;
    next_adv = adv;
    g.advantages[u[n]] = adv;
    g.returns[u[n]] = adv + v;
  }
  return g;
}

double k3(double logp, double logp_ref) {
  const double x = std::clamp(logp_ref - logp, -10.0, 10.0);
  return std::max(0.0, std::expm1(x) - x);
}

namespace {

// dk3/dlogp: -(e^x - 1) inside the clamp range, 0 where the clamp is active.
double k3_grad(double logp, double logp_ref) {
  const double x = logp_ref - logp;
  if (x < -10.0 || x > 10.0) return 0.0;
  return -std::expm1(x);
}

// The clipped surrogate for one token at ratio rho: returns ℓ = -objective and sets
// dl_drho (dℓ/dρ) and clipped (the gradient was zeroed by a clip).
double surrogate(double rho, double A, const LossConfig& cfg, double& dl_drho, bool& clipped) {
  const double lo = 1.0 - cfg.eps_low, hi = 1.0 + cfg.eps_high;
  double obj = rho * A;
  dl_drho = -A;
  clipped = false;
  if ((A > 0 && rho > hi) || (A < 0 && rho < lo)) {
    obj = std::clamp(rho, lo, hi) * A;
    dl_drho = 0;
    clipped = true;
  }
  if (cfg.dual_clip > 0 && A < 0 && obj < cfg.dual_clip * A) {
    obj = cfg.dual_clip * A;
    dl_drho = 0;
    clipped = true;
  }
  return -obj;
}

void check_config(const LossConfig& cfg) {
  require(cfg.ratio_level == "token" || cfg.ratio_level == "sequence",
          cat("ratio_level: unknown mode '", cfg.ratio_level, "' (token, sequence)"));
  require(cfg.tis_mode == "truncate" || cfg.tis_mode == "mask",
          cat("tis_mode: unknown mode '", cfg.tis_mode, "' (truncate, mask)"));
  require(cfg.loss_agg == "token_mean" || cfg.loss_agg == "constant" || cfg.loss_agg == "seq_mean",
          cat("loss_agg: unknown mode '", cfg.loss_agg, "' (token_mean, constant, seq_mean)"));
  require(cfg.eps_low >= 0 && cfg.eps_low < 1,
          cat("eps_low: must lie in [0, 1), got ", cfg.eps_low));
  require(cfg.eps_high >= 0 && std::isfinite(cfg.eps_high),
          cat("eps_high: must be finite and >= 0, got ", cfg.eps_high));
  require(cfg.dual_clip == 0 || cfg.dual_clip > 1,
          cat("dual_clip: must be 0 (off) or > 1, got ", cfg.dual_clip));
  require(cfg.tis_cap >= 0 && std::isfinite(cfg.tis_cap),
          cat("tis_cap: must be finite and >= 0 (0: off), got ", cfg.tis_cap));
  require(cfg.kl_beta >= 0 && std::isfinite(cfg.kl_beta),
          cat("kl_beta: must be finite and >= 0, got ", cfg.kl_beta));
  require(cfg.max_len >= 0,
          cat("max_len: must be >= 0 (0: the longest sample), got ", cfg.max_len));
}

void check_input(const LossInput& in, size_t i, const LossConfig& cfg) {
  const size_t T = in.mask.size();
  auto same = [&](const std::vector<double>& v, const char* name, bool used) {
    require(v.size() == T || (!used && v.empty()),
            cat("policy_loss: sample ", i, " ", name, " has ", v.size(), " entries, mask has ", T));
  };
  same(in.A, "A", true);
  same(in.logp, "logp", true);
  same(in.logp_old, "logp_old", true);
  same(in.logp_behavior, "logp_behavior", cfg.tis_cap > 0);
  same(in.logp_ref, "logp_ref", cfg.kl_beta > 0);
}

}  // namespace

LossResult policy_loss(const std::vector<LossInput>& batch, const LossConfig& cfg) {
  check_config(cfg);
  for (size_t i = 0; i < batch.size(); ++i) check_input(batch[i], i, cfg);

  const bool sequence = cfg.ratio_level == "sequence";
  const bool tis = cfg.tis_cap > 0, tis_mask = cfg.tis_mode == "mask";
  const bool kl = cfg.kl_beta > 0;

  LossResult res;
  res.grad.resize(batch.size());
  std::vector<double> n_tok(batch.size(), 0.0);
  double total_tokens = 0, live_samples = 0;
  size_t longest = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    res.grad[i].assign(batch[i].mask.size(), 0.0);
    for (uint8_t m : batch[i].mask) n_tok[i] += m ? 1 : 0;
    total_tokens += n_tok[i];
    if (n_tok[i] > 0) live_samples += 1;
    longest = std::max(longest, batch[i].mask.size());
  }

  // N_norm: per-token divisor of each sample (seq_mean: n_i · S).
  double norm = 0;
  if (cfg.loss_agg == "token_mean") {
    norm = total_tokens;
  } else if (cfg.loss_agg == "constant") {
    const double L =
        cfg.max_len > 0 ? static_cast<double>(cfg.max_len) : static_cast<double>(longest);
    norm = static_cast<double>(batch.size()) * L;
  } else {
    norm = live_samples;
  }
  res.normaliser = norm;
  if (total_tokens == 0 || norm == 0) {
    res.loss = 0;
    res.clip_fraction = 0;
    res.kl = 0;
    res.tis_mean = 1;
    return res;
  }

  double loss = 0, clipped_count = 0, kl_sum = 0, w_sum = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const LossInput& in = batch[i];
    if (n_tok[i] == 0) continue;
    const size_t T = in.mask.size();
    const double div = cfg.loss_agg == "seq_mean" ? n_tok[i] * norm : norm;

    double rho_seq = 0;
    if (sequence) {
      double s = 0;
      for (size_t t = 0; t < T; ++t)
        if (in.mask[t]) s += in.logp[t] - in.logp_old[t];
      rho_seq = std::exp(s / n_tok[i]);
    }

    double sample_loss = 0;
    double seq_dl = 0;  // GSPO: Σ_t w_t dℓ_t/dρ_i (before the divisor)
    bool seq_clipped = false;
    for (size_t t = 0; t < T; ++t) {
      if (!in.mask[t]) continue;
      const double rho = sequence ? rho_seq : std::exp(in.logp[t] - in.logp_old[t]);
      double w = 1;
      if (tis) {
        const double iw = std::exp(in.logp_old[t] - in.logp_behavior[t]);
        w = tis_mask ? (iw > cfg.tis_cap ? 0.0 : 1.0) : std::min(iw, cfg.tis_cap);
      }
      double dl_drho = 0;
      bool clipped = false;
      const double l = surrogate(rho, in.A[t], cfg, dl_drho, clipped);
      double c = w * l;
      double g = 0;
      if (sequence) {
        seq_dl += w * dl_drho;
        seq_clipped = seq_clipped || clipped;
      } else {
        g = w * dl_drho * rho;
        if (clipped) clipped_count += 1;
      }
      if (kl) {
        const double D = k3(in.logp[t], in.logp_ref[t]);
        c += cfg.kl_beta * D;
        g += cfg.kl_beta * k3_grad(in.logp[t], in.logp_ref[t]);
        kl_sum += D;
      }
      w_sum += w;
      sample_loss += c;
      res.grad[i][t] = g / div;
    }
    if (sequence) {
      if (seq_clipped) clipped_count += 1;
      // dρ_i/dlogp_t = ρ_i / n_i for every mask-1 token of the sample.
      const double gs = seq_dl * rho_seq / n_tok[i];
      for (size_t t = 0; t < T; ++t)
        if (in.mask[t]) res.grad[i][t] += gs / div;
    }
    loss += sample_loss / div;
  }
  res.loss = loss;
  res.clip_fraction = clipped_count / (sequence ? live_samples : total_tokens);
  res.kl = kl_sum / total_tokens;
  res.tis_mean = w_sum / total_tokens;
  return res;
}

double staleness_weight(int64_t staleness, int64_t max_staleness, const std::string& mode) {
  require(mode == "reject" || mode == "downweight",
          cat("staleness_mode: unknown mode '", mode, "' (reject, downweight)"));
  require(staleness >= 0, cat("staleness: must be >= 0, got ", staleness));
  require(max_staleness >= 0, cat("max_staleness: must be >= 0, got ", max_staleness));
  if (staleness <= max_staleness) return 1.0;
  if (mode == "reject") return 0.0;
  return std::pow(0.5, static_cast<double>(staleness - max_staleness));
}

}  // namespace myriad::train::rl
