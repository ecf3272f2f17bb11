#include "train/balancer.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "ops/ops.h"

namespace myriad::train {
namespace {

void check_route(const Tensor& s, const Tensor& sel, int64_t n, int64_t k) {
  MYRIAD_CHECK(s.dim() == 2 && s.size(1) == n, "balancer: scores must be [N, ", n, "], got ",
               shape_str(s.shape()));
  MYRIAD_CHECK(sel.dim() == 2 && sel.size(0) == s.size(0) && sel.size(1) == k,
               "balancer: selected must be [", s.size(0), ", ", k, "], got ",
               shape_str(sel.shape()));
}

std::vector<double> host_bias(const Tensor& b, int64_t n) {
  MYRIAD_CHECK(b.dim() == 1 && b.size(0) == n, "balancer: bias must be [", n, "], got ",
               shape_str(b.shape()));
  return b.to_doubles();
}

void centre(std::vector<double>& b) {
  const double mu = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(b.size());
  for (double& x : b) x -= mu;
}

// The r-th largest (1-based) of v, which it reorders.
double kth_largest(std::vector<double>& v, int64_t r) {
  r = std::clamp<int64_t>(r, 1, static_cast<int64_t>(v.size()));
  std::nth_element(v.begin(), v.begin() + (r - 1), v.end(), std::greater<>());
  return v[r - 1];
}

}  // namespace

std::vector<int64_t> expert_counts(const Tensor& selected_Nk, int64_t n) {
  std::vector<int64_t> c(n, 0);
  for (int64_t j : selected_Nk.to_ints()) {
    MYRIAD_CHECK(j >= 0 && j < n, "balancer: expert index ", j, " out of range [0, ", n, ")");
    ++c[j];
  }
  return c;
}

Tensor route_topk(const Tensor& scores_Nn, const Tensor& bias_n, int64_t k) {
  const int64_t N = scores_Nn.size(0), n = scores_Nn.size(1);
  MYRIAD_CHECK(k >= 1 && k <= n, "balancer: route_topk k ", k, " with ", n, " experts");
  const std::vector<double> s = scores_Nn.to_doubles(), b = host_bias(bias_n, n);
  std::vector<int64_t> out(N * k), order(n);
  for (int64_t i = 0; i < N; ++i) {
    std::iota(order.begin(), order.end(), 0);
    auto v = [&](int64_t j) { return s[i * n + j] + b[j]; };
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int64_t a, int64_t c) { return v(a) > v(c) || (v(a) == v(c) && a < c); });
    std::copy(order.begin(), order.begin() + k, out.begin() + i * k);
  }
  return Tensor::from_ints(out, {N, k});
}

Balancer::Balancer(BalancerConfig c, int64_t n_experts, int64_t top_k)
    : c_(std::move(c)), n_(n_experts), k_(top_k), b_(n_experts, 0.0), counts_(n_experts, 0) {
  MYRIAD_CHECK(n_ >= 2 && k_ >= 1 && k_ < n_, "balancer: need 1 <= k < n, got k ", k_, ", n ", n_);
  MYRIAD_CHECK(c_.mode == "quantile" || c_.mode == "quantile_band" || c_.mode == "sign" ||
                   c_.mode == "aux_loss" || c_.mode == "none",
               "balancer: unknown mode ", c_.mode);
  MYRIAD_CHECK(c_.bins >= 1 && c_.ema > 0 && c_.ema <= 1, "balancer: bins ", c_.bins, ", ema ",
               c_.ema, " out of range");
}

void Balancer::observe(const Tensor& scores_Nn, const Tensor& selected_Nk, const Tensor& bias) {
  check_route(scores_Nn, selected_Nk, n_, k_);
  const int64_t N = scores_Nn.size(0);
  const std::vector<int64_t> c = expert_counts(selected_Nk, n_);
  for (int64_t j = 0; j < n_; ++j) counts_[j] += c[j];
  const bool first = m_ == 0;
  m_ += N;
  if (c_.mode != "quantile") return;

  const std::vector<double> b = bias.defined() ? host_bias(bias, n_) : b_;
  const std::vector<double> s = scores_Nn.to_doubles();
  if (first) {
    set_range(b);
    if (exact_)
      marg_.assign(n_, {});
    else
      hist_.assign(n_ * c_.bins, 0);
  }
  std::vector<double> row(n_);
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = 0; j < n_; ++j) row[j] = s[i * n_ + j] + b[j];
    const double alpha = kth_largest(row, k_ + 1);  // the (k+1)-th biased value: the cut-off
    for (int64_t j = 0; j < n_; ++j) {
      const double r = alpha - s[i * n_ + j];  // i would pick j iff b_j > r
      if (exact_) {
        marg_[j].push_back(static_cast<float>(r));
      } else {
        const auto beta =
            std::clamp<int64_t>(static_cast<int64_t>(std::floor((r - lo_) / w_)), 0, c_.bins - 1);
        ++hist_[j * c_.bins + beta];
      }
    }
  }
}

void Balancer::quantile_update(std::vector<double>& b) {
  const int64_t B = c_.bins;
  const double q = static_cast<double>(m_) * static_cast<double>(k_) / static_cast<double>(n_);
  const auto Q = static_cast<int64_t>(std::ceil(q - 1e-9));
  std::vector<double> bh(n_);
  for (int64_t j = 0; j < n_; ++j) {
    if (exact_) {  // the ⌈q⌉-th smallest margin
      auto& v = marg_[j];
      std::nth_element(v.begin(), v.begin() + (Q - 1), v.end());
      bh[j] = v[Q - 1];
      continue;
    }
    const int32_t* h = &hist_[j * B];
    int64_t cum = 0, beta = 0;
    while (beta < B && cum + h[beta] < Q) cum += h[beta++];
    if (beta == B) {  // fewer than ⌈q⌉ margins: the top edge of R
      bh[j] = lo_ + static_cast<double>(B) * w_;
      continue;
    }
    const double frac = std::clamp(static_cast<double>(Q - cum) / h[beta], 0.0, 1.0);
    bh[j] = lo_ + (static_cast<double>(beta) + frac) * w_;
  }
  centre(bh);
  for (int64_t j = 0; j < n_; ++j) b[j] = (1.0 - c_.ema) * b[j] + c_.ema * bh[j];
  centre(b);  // the EMA of centred vectors is centred; this removes rounding drift too
}

// The range R = [b_min − 1, b_max + 1] of this step's margins (§3.2).
void Balancer::set_range(const std::vector<double>& b) {
  const auto [mn, mx] = std::minmax_element(b.begin(), b.end());
  lo_ = *mn - 1.0;
  w_ = (*mx - *mn + 2.0) / static_cast<double>(c_.bins);
}

void Balancer::all_reduce(dist::Comm& c, const Tensor& bias) {
  if (c.size() == 1) return;
  if (m_ == 0 && c_.mode == "quantile") set_range(bias.defined() ? host_bias(bias, n_) : b_);
  MYRIAD_CHECK(!exact_,
               "balancer: the exact quantile mode keeps every margin; it does not run "
               "data parallel");
  // int32, as the planner counts it: [histogram n x B (quantile mode) | counts n | tokens].
  const size_t n = static_cast<size_t>(n_);
  const size_t H = c_.mode == "quantile" ? n * static_cast<size_t>(c_.bins) : 0;
  if (H && hist_.empty()) hist_.assign(H, 0);  // this rank saw no tokens
  std::vector<int32_t> v(H + n + 1);
  std::copy(hist_.begin(), hist_.begin() + static_cast<std::ptrdiff_t>(H), v.begin());
  for (size_t j = 0; j < n; ++j) v[H + j] = static_cast<int32_t>(counts_[j]);
  v[H + n] = static_cast<int32_t>(m_);
  c.all_reduce_sum("balancer_all_reduce", v.data(), v.size());
  std::copy(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(H), hist_.begin());
  for (size_t j = 0; j < n; ++j) counts_[j] = v[H + j];
  m_ = v[H + n];
}

void Balancer::update(Tensor& bias) {
  std::vector<double> b = host_bias(bias, n_);
  const double q = static_cast<double>(m_) * static_cast<double>(k_) / static_cast<double>(n_);
  if (c_.mode == "none" || c_.mode == "aux_loss") {
    std::fill(b.begin(), b.end(), 0.0);
  } else if (m_ > 0 && c_.mode == "quantile") {
    quantile_update(b);
  } else if (m_ > 0 && c_.mode == "quantile_band") {
    for (int64_t j = 0; j < n_; ++j) {
      const auto cj = static_cast<double>(counts_[j]);
      const double v = cj > c_.rho_hi * q   ? (cj - c_.rho_hi * q) / q
                       : cj < c_.rho_lo * q ? (cj - c_.rho_lo * q) / q
                                            : 0.0;
      b[j] -= c_.eta * std::clamp(v, -c_.v_max, c_.v_max);
    }
    if (c_.recentre) centre(b);
  } else if (m_ > 0 && c_.mode == "sign" && !(c_.freeze_after && updates_ >= *c_.freeze_after)) {
    for (int64_t j = 0; j < n_; ++j) {
      const auto cj = static_cast<double>(counts_[j]);
      b[j] += c_.gamma_b * static_cast<double>((q > cj) - (q < cj));
    }
  }
  bias.copy_(Tensor::from_doubles(b, {n_}, DType::F64));
  b_ = std::move(b);
  ++updates_;
  m_ = 0;
  std::fill(counts_.begin(), counts_.end(), 0);
  hist_.clear();
  marg_.clear();
}

nlohmann::json Balancer::state() const {
  return {{"b", b_}, {"updates", updates_}, {"m", m_},         {"counts", counts_}, {"lo", lo_},
          {"w", w_}, {"hist", hist_},       {"margins", marg_}};
}

void Balancer::load_state(const nlohmann::json& j) {
  auto b = j.at("b").get<std::vector<double>>();
  auto counts = j.at("counts").get<std::vector<int64_t>>();
  MYRIAD_CHECK(static_cast<int64_t>(b.size()) == n_ && static_cast<int64_t>(counts.size()) == n_,
               "balancer: saved state is for ", b.size(), " experts, not ", n_);
  b_ = std::move(b);
  counts_ = std::move(counts);
  updates_ = j.at("updates").get<int64_t>();
  m_ = j.at("m").get<int64_t>();
  lo_ = j.at("lo").get<double>();
  w_ = j.at("w").get<double>();
  hist_ = j.at("hist").get<std::vector<int32_t>>();
  marg_ = j.at("margins").get<std::vector<std::vector<float>>>();
}

Tensor Balancer::aux_loss(const Tensor& scores_Nn, const Tensor& selected_Nk,
                          int64_t seq_len) const {
  check_route(scores_Nn, selected_Nk, n_, k_);
  const int64_t N = scores_Nn.size(0);
  const int64_t L = c_.aux_scope == "sequence" && seq_len > 0 ? seq_len : N;
  MYRIAD_CHECK(N % L == 0, "balancer: aux_loss ", N, " tokens do not split into sequences of ", L);
  const int64_t S = N / L;
  // f [S, n]: share of routing slots per sequence (a constant).
  std::vector<double> f(S * n_, 0.0);
  const std::vector<int64_t> sel = selected_Nk.to_ints();
  for (int64_t i = 0; i < N; ++i)
    for (int64_t s = 0; s < k_; ++s)
      f[(i / L) * n_ + sel[i * k_ + s]] += 1.0 / static_cast<double>(L * k_);
  Tensor fT = Tensor::from_doubles(f, {S, n_}, scores_Nn.dtype(), scores_Nn.device());
  Tensor pn = ops::div(scores_Nn, ops::sum(scores_Nn, {-1}, true));
  Tensor P = ops::mean(ops::reshape(pn, {S, L, n_}), {1});  // [S, n]
  return ops::mul(ops::sum(ops::mul(fT, P)), c_.aux_alpha * static_cast<double>(n_) / S);
}

Tensor qb_exact(const Tensor& scores_Nn, int64_t k, int64_t iters) {
  MYRIAD_CHECK(scores_Nn.dim() == 2, "qb_exact: scores must be [m, n], got ",
               shape_str(scores_Nn.shape()));
  const int64_t m = scores_Nn.size(0), n = scores_Nn.size(1);
  MYRIAD_CHECK(k >= 1 && k < n && m >= 1, "qb_exact: need 1 <= k < n, got k ", k, ", n ", n);
  const std::vector<double> s = scores_Nn.to_doubles();
  const auto Q = static_cast<int64_t>(std::ceil(static_cast<double>(m * k) / n - 1e-9));
  std::vector<double> beta(n, 0.0), alpha(m), row(n), col(m);
  for (int64_t t = 0; t < iters; ++t) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) row[j] = s[i * n + j] - beta[j];
      alpha[i] = 0.5 * (kth_largest(row, k + 1) + kth_largest(row, k));
    }
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t i = 0; i < m; ++i) col[i] = s[i * n + j] - alpha[i];
      beta[j] = 0.5 * (kth_largest(col, Q + 1) + kth_largest(col, Q));
    }
  }
  for (double& x : beta) x = -x;
  centre(beta);
  return Tensor::from_doubles(beta, {n}, DType::F64);
}

}  // namespace myriad::train
