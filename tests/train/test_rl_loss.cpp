// The arithmetic pitfalls of TRAINING.md §7.6 (items 2-7 and 10-14) as unit tests of
// train/rl_loss, plus finite-difference checks of the policy-loss gradient and config validation.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "train/rl_loss.h"

namespace myriad::train::rl {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// A small deterministic generator for test inputs (64-bit LCG, top 53 bits).
struct Lcg {
  uint64_t s;
  explicit Lcg(uint64_t seed) : s(seed * 2862933555777941757ULL + 3037000493ULL) {}
  double uniform() {
    s = s * 6364136223846793005ULL + 1442695040888963407ULL;
    return static_cast<double>(s >> 11) * (1.0 / 9007199254740992.0);
  }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  size_t below(size_t n) { return static_cast<size_t>(uniform() * static_cast<double>(n)); }
};

void expect_invalid(const std::function<void()>& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no exception; expected one naming '" << needle << "'";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not name '" << needle << "'";
  }
}

// A loss input with logp = logp_old = logp_behavior = logp_ref = 0 (ratio 1, no KL, w = 1).
LossInput flat_input(std::vector<uint8_t> mask, std::vector<double> A) {
  LossInput in;
  const size_t T = mask.size();
  in.mask = std::move(mask);
  in.A = std::move(A);
  in.logp.assign(T, 0.0);
  in.logp_old.assign(T, 0.0);
  in.logp_behavior.assign(T, 0.0);
  in.logp_ref.assign(T, 0.0);
  return in;
}

// A random batch: sample lengths 3..10, ~70% mask-1 tokens, every sample with at least one, mask-0
// positions filled with garbage (NaN / huge). Log-ratios logp - logp_old are drawn near centres
// that keep the ratio away from every clip boundary (1 - 0.2, 1 + 0.28, dual clip 3); at the
// sequence level the mean log-ratio of each sample is placed near such a centre.
std::vector<LossInput> random_batch(uint64_t seed, bool sequence, size_t G = 4) {
  static const double centres[] = {-0.6, 0.0, 0.55, 1.4};
  Lcg rng(seed);
  std::vector<LossInput> batch(G);
  for (LossInput& in : batch) {
    const size_t T = 3 + rng.below(8);
    in.mask.assign(T, 0);
    for (size_t t = 0; t < T; ++t) in.mask[t] = rng.uniform() < 0.7 ? 1 : 0;
    in.mask[rng.below(T)] = 1;
    in.A.assign(T, 0.0);
    in.logp.assign(T, 0.0);
    in.logp_old.assign(T, 0.0);
    in.logp_behavior.assign(T, 0.0);
    in.logp_ref.assign(T, 0.0);
    std::vector<double> lr(T, 0.0);
    double mean = 0, n = 0;
    for (size_t t = 0; t < T; ++t) {
      if (!in.mask[t]) continue;
      lr[t] = sequence ? rng.uniform(-0.3, 0.3) : centres[rng.below(4)] + rng.uniform(-0.05, 0.05);
      mean += lr[t];
      n += 1;
    }
    mean /= n;
    const double target = centres[rng.below(4)] + rng.uniform(-0.05, 0.05);
    for (size_t t = 0; t < T; ++t) {
      if (!in.mask[t]) {
        in.A[t] = 1e30;
        in.logp[t] = kNaN;
        in.logp_old[t] = -1e30;
        in.logp_behavior[t] = kNaN;
        in.logp_ref[t] = 1e30;
        continue;
      }
      if (sequence) lr[t] += target - mean;
      in.A[t] = rng.uniform(-2.0, 2.0);
      in.logp_old[t] = rng.uniform(-4.0, -0.1);
      in.logp[t] = in.logp_old[t] + lr[t];
      in.logp_behavior[t] = in.logp_old[t] - rng.uniform(-1.0, 1.0);
      in.logp_ref[t] = in.logp[t] + rng.uniform(-2.0, 2.0);
    }
  }
  return batch;
}

Sample make_sample(std::vector<uint8_t> mask, std::vector<int32_t> turn, std::vector<double> r_turn,
                   double R) {
  Sample s;
  s.mask = std::move(mask);
  s.turn = std::move(turn);
  s.r_turn = std::move(r_turn);
  s.R = R;
  return s;
}

// ---------------------------------------------------------------------------------------------
// §7.6 item 2: GAE across a tool span.
TEST(RlPitfalls, P02_GaeAcrossToolSpan) {
  const Sample s = make_sample({1, 1, 0, 0, 0, 1}, {0, 0, -1, -1, -1, 1}, {}, 1.0);
  const Gae g = gae(s, std::vector<double>(6, 0.0), 1.0, 1.0);
  const std::vector<double> want = {1, 1, 0, 0, 0, 1};
  for (size_t t = 0; t < 6; ++t) {
    EXPECT_EQ(g.advantages[t], want[t]) << t;
    EXPECT_EQ(g.returns[t], want[t]) << t;
  }
  // With γ = 0.9 the decay counts action steps only: the tool span adds no decay step.
  const Gae d = gae(s, std::vector<double>(6, 0.0), 0.9, 1.0);
  EXPECT_NEAR(d.advantages[5], 1.0, 1e-15);
  EXPECT_NEAR(d.advantages[1], 0.9, 1e-15);
  EXPECT_NEAR(d.advantages[0], 0.81, 1e-15);
}

// §7.6 item 3: a trajectory that ends in observation tokens keeps its terminal reward.
TEST(RlPitfalls, P03_TrajectoryEndingInObservation) {
  const Sample s = make_sample({0, 1, 1, 0, 0, 0}, {-1, 0, 0, -1, -1, -1}, {}, 2.0);
  const Gae g = gae(s, std::vector<double>(6, 0.0), 1.0, 1.0);
  EXPECT_EQ(g.advantages[1], 2.0);
  EXPECT_EQ(g.advantages[2], 2.0);
  for (size_t t : {0, 3, 4, 5}) EXPECT_EQ(g.advantages[t], 0.0) << t;
  // R lands on the last mask-1 token (index 2): with γ = 0.5 it gets R, the one before R/2.
  std::vector<double> v = {7, 0, 0, 50, 50, 50};
  const Gae h = gae(s, v, 0.5, 1.0);
  EXPECT_EQ(h.advantages[2], 2.0);
  EXPECT_EQ(h.advantages[1], 1.0);
  EXPECT_EQ(h.returns[2], 2.0);
}

// §7.6 item 4: values at mask-0 positions are never read (not even as the bootstrap).
TEST(RlPitfalls, P04_MaskedValuesNeverBootstrap) {
  const Sample s = make_sample({1, 1, 0, 0, 1, 0}, {0, 0, -1, -1, 1, -1}, {}, 1.0);
  std::vector<double> v = {0.3, -0.2, 0, 0, 0.5, 0};
  const Gae a = gae(s, v, 0.9, 0.8);
  // Hand-computed: δ = [0.9·(-0.2) - 0.3, 0.9·0.5 + 0.2, 1 - 0.5] = [-0.48, 0.65, 0.5].
  EXPECT_NEAR(a.advantages[4], 0.5, 1e-15);
  EXPECT_NEAR(a.advantages[1], 0.65 + 0.72 * 0.5, 1e-15);
  EXPECT_NEAR(a.advantages[0], -0.48 + 0.72 * 1.01, 1e-15);
  EXPECT_NEAR(a.returns[0], 0.2472 + 0.3, 1e-15);
  v[2] = v[3] = v[5] = 100;
  const Gae b = gae(s, v, 0.9, 0.8);
  for (size_t t = 0; t < 6; ++t) {
    EXPECT_EQ(a.advantages[t], b.advantages[t]) << t;
    EXPECT_EQ(a.returns[t], b.returns[t]) << t;
  }
  // The bootstrap is the only value after u_N.
  const Gae c = gae(s, v, 0.9, 0.8, 2.0);
  EXPECT_NEAR(c.advantages[4], 0.5 + 0.9 * 2.0, 1e-15);
}

// §7.6 item 5: an action before a tool call receives the later reward.
TEST(RlPitfalls, P05_ReturnToGoCarriesThroughMaskZero) {
  // [a a | tool tool | a a]: turn 1's process reward 0.5 lands on index 5, R = 1 too.
  const Sample s = make_sample({1, 1, 0, 0, 1, 1}, {0, 0, -1, -1, 1, 1}, {0.0, 0.5}, 1.0);
  const Gae g = gae(s, std::vector<double>(6, 0.0), 1.0, 1.0);
  for (size_t t : {0, 1, 4, 5}) EXPECT_EQ(g.advantages[t], 1.5) << t;
  const Gae l = gae(s, std::vector<double>(6, 0.0), 1.0, 0.95);
  EXPECT_NEAR(l.advantages[0], 0.95 * 0.95 * 0.95 * 1.5, 1e-15);
  EXPECT_NEAR(l.advantages[1], 0.95 * 0.95 * 1.5, 1e-15);

  // Group advantages: turn 1's reward reaches turn 0 through the turn returns.
  std::vector<Sample> group = {make_sample({0, 1, 1, 0, 1}, {-1, 0, 0, -1, 1}, {0.0, 1.0}, 0.0),
                               make_sample({0, 1, 1, 0, 1}, {-1, 0, 0, -1, 1}, {0.0, 0.0}, 0.0)};
  AdvantageConfig cfg;
  cfg.std_norm = false;
  cfg.lambda_process = 0.5;
  const GroupAdvantages ga = group_advantages(group, cfg);
  EXPECT_FALSE(ga.all_equal);
  // G = {1, 1} and {0, 0}: mean 0.5, so A^turn = ±0.5 for both turns; A = 0.5 · (±0.5).
  EXPECT_EQ(ga.A[0][1], 0.25);
  EXPECT_EQ(ga.A[0][2], 0.25);
  EXPECT_EQ(ga.A[0][4], 0.25);
  EXPECT_EQ(ga.A[1][1], -0.25);
  EXPECT_EQ(ga.A[0][0], 0.0);
  EXPECT_EQ(ga.A[0][3], 0.0);
  cfg.std_norm = true;
  const GroupAdvantages gn = group_advantages(group, cfg);
  EXPECT_NEAR(gn.A[0][1], 0.5 * 0.5 / (0.5 + 1e-6), 1e-15);
  EXPECT_NEAR(gn.A[1][2], -0.5 * 0.5 / (0.5 + 1e-6), 1e-15);
}

// §7.6 item 6: an all-equal group has exactly zero advantages and is flagged.
TEST(RlPitfalls, P06_AllEqualGroup) {
  std::vector<Sample> group = {
      make_sample({0, 1, 1, 0, 1}, {-1, 0, 0, -1, 1}, {0.3, 0.3}, 0.1),
      make_sample({1, 1, 1}, {0, 0, 0}, {0.3}, 0.1),
      make_sample({0, 1}, {-1, -1}, {}, 0.1),  // no turns
  };
  for (double eps : {1e-6, 0.0}) {
    AdvantageConfig cfg;
    cfg.std_norm = true;
    cfg.eps = eps;
    const GroupAdvantages ga = group_advantages(group, cfg);
    EXPECT_TRUE(ga.all_equal);
    ASSERT_EQ(ga.A.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      ASSERT_EQ(ga.A[i].size(), group[i].mask.size());
      for (double a : ga.A[i]) {
        EXPECT_FALSE(std::isnan(a));
        EXPECT_EQ(a, 0.0);
      }
    }
  }
  // Equal R but different turn rewards: not all-equal; the outcome part is exactly 0.
  group[1].r_turn = {0.7};
  const GroupAdvantages gb = group_advantages(group, AdvantageConfig{});
  EXPECT_FALSE(gb.all_equal);
  EXPECT_EQ(gb.A[2][1], 0.0);  // mask-1 token outside any turn: outcome part only
  EXPECT_GT(gb.A[1][0], 0.0);
  EXPECT_GT(gb.A[0][1], 0.0);  // G = {0.6, 0.3} and {0.7}: mean 1.6 / 3
  EXPECT_LT(gb.A[0][4], 0.0);
}

TEST(RlAdvantage, OutcomeAndTurnHandExample) {
  // R = {1, 0}: mean 0.5, std 0.5. Sample 0's token with a turn index past r_turn gets A^out only.
  std::vector<Sample> group = {make_sample({1, 1, 0}, {0, 3, -1}, {2.0}, 1.0),
                               make_sample({1, 0}, {0, -1}, {0.0}, 0.0)};
  AdvantageConfig cfg;
  const GroupAdvantages ga = group_advantages(group, cfg);
  const double out = 0.5 / (0.5 + 1e-6), turn = 1.0 / (1.0 + 1e-6);
  EXPECT_NEAR(ga.A[0][0], out + 0.5 * turn, 1e-15);
  EXPECT_NEAR(ga.A[0][1], out, 1e-15);
  EXPECT_EQ(ga.A[0][2], 0.0);
  EXPECT_NEAR(ga.A[1][0], -out - 0.5 * turn, 1e-15);
  EXPECT_EQ(ga.A[1][1], 0.0);
  cfg.lambda_process = 0;
  cfg.std_norm = false;
  const GroupAdvantages gd = group_advantages(group, cfg);
  EXPECT_EQ(gd.A[0][0], 0.5);
  EXPECT_EQ(gd.A[1][0], -0.5);
  // γ_turn discounts later turns: G = {1 + 0.5·3, 3} over turns {1, 3}.
  std::vector<Sample> two = {make_sample({1, 1}, {0, 1}, {1.0, 3.0}, 0.0),
                             make_sample({1}, {0}, {0.0}, 0.0)};
  cfg.gamma_turn = 0.5;
  cfg.lambda_process = 1.0;
  const GroupAdvantages gt = group_advantages(two, cfg);
  const double mean = (2.5 + 3.0 + 0.0) / 3.0;
  EXPECT_NEAR(gt.A[0][0], 2.5 - mean, 1e-15);
  EXPECT_NEAR(gt.A[0][1], 3.0 - mean, 1e-15);
  EXPECT_NEAR(gt.A[1][0], -mean, 1e-15);
}

// §7.6 item 7: the first step on-policy is REINFORCE with a group baseline.
TEST(RlPitfalls, P07_OnPolicyFirstStep) {
  for (const char* level : {"token", "sequence"}) {
    std::vector<LossInput> batch = random_batch(7, false);
    double N = 0, want_loss = 0;
    for (LossInput& in : batch) {
      double a = 0;
      for (size_t t = in.mask.size(); t-- > 0;)
        if (in.mask[t]) a = in.A[t];
      for (size_t t = 0; t < in.mask.size(); ++t) {
        if (!in.mask[t]) continue;
        in.logp_old[t] = in.logp_behavior[t] = in.logp[t];
        if (std::string(level) == "sequence") in.A[t] = a;  // one advantage per sequence
        N += 1;
      }
    }
    for (const LossInput& in : batch)
      for (size_t t = 0; t < in.mask.size(); ++t)
        if (in.mask[t]) want_loss += -in.A[t] / N;
    LossConfig cfg;
    cfg.ratio_level = level;
    cfg.dual_clip = 3;
    cfg.tis_cap = 2;
    const LossResult r = policy_loss(batch, cfg);
    EXPECT_EQ(r.clip_fraction, 0.0) << level;
    EXPECT_EQ(r.tis_mean, 1.0) << level;
    EXPECT_EQ(r.normaliser, N) << level;
    EXPECT_NEAR(r.loss, want_loss, 1e-12) << level;
    for (size_t i = 0; i < batch.size(); ++i)
      for (size_t t = 0; t < batch[i].mask.size(); ++t) {
        const double want = batch[i].mask[t] ? -batch[i].A[t] / N : 0.0;
        EXPECT_NEAR(r.grad[i][t], want, 1e-12) << level << " " << i << " " << t;
      }
  }
}

// §7.6 item 10: each aggregation's N_norm, and padding changes nothing.
TEST(RlPitfalls, P10_Normaliser) {
  // ρ = 1, so ℓ_t = -A_t. Σℓ: sample 0 -3 over 2 tokens, sample 1 -3 over 3, sample 2 empty.
  const std::vector<LossInput> batch = {flat_input({1, 1, 0}, {2, 1, 9}),
                                        flat_input({0, 1, 1, 1}, {9, 3, 3, -3}),
                                        flat_input({0, 0}, {5, 5})};
  LossConfig cfg;
  cfg.loss_agg = "token_mean";
  LossResult r = policy_loss(batch, cfg);
  EXPECT_EQ(r.normaliser, 5.0);
  EXPECT_NEAR(r.loss, -6.0 / 5.0, 1e-15);
  EXPECT_NEAR(r.grad[0][0], -2.0 / 5.0, 1e-15);
  EXPECT_NEAR(r.grad[1][3], 3.0 / 5.0, 1e-15);
  cfg.loss_agg = "constant";
  r = policy_loss(batch, cfg);
  EXPECT_EQ(r.normaliser, 12.0);  // G = 3, L_max = longest T = 4
  EXPECT_NEAR(r.loss, -6.0 / 12.0, 1e-15);
  EXPECT_NEAR(r.grad[0][0], -2.0 / 12.0, 1e-15);
  cfg.max_len = 10;
  r = policy_loss(batch, cfg);
  EXPECT_EQ(r.normaliser, 30.0);
  EXPECT_NEAR(r.loss, -6.0 / 30.0, 1e-15);
  cfg.max_len = 0;
  cfg.loss_agg = "seq_mean";
  r = policy_loss(batch, cfg);
  EXPECT_EQ(r.normaliser, 2.0);  // samples with a mask-1 token
  EXPECT_NEAR(r.loss, (-3.0 / 2.0 - 3.0 / 3.0) / 2.0, 1e-15);
  EXPECT_NEAR(r.grad[0][0], -2.0 / 4.0, 1e-15);
  EXPECT_NEAR(r.grad[1][1], -3.0 / 6.0, 1e-15);
  for (const auto& g : r.grad[2]) EXPECT_EQ(g, 0.0);

  // Padding: append mask-0 tokens with garbage everywhere; loss and grads are bit-identical.
  for (const char* level : {"token", "sequence"})
    for (const char* agg : {"token_mean", "seq_mean", "constant"}) {
      LossConfig c;
      c.ratio_level = level;
      c.loss_agg = agg;
      c.max_len = 16;
      c.dual_clip = 3;
      c.tis_cap = 2;
      c.kl_beta = 0.05;
      const std::vector<LossInput> base = random_batch(11, std::string(level) == "sequence");
      std::vector<LossInput> padded = base;
      for (LossInput& in : padded)
        for (int k = 0; k < 5; ++k) {
          in.mask.push_back(0);
          in.A.push_back(1e300);
          in.logp.push_back(kNaN);
          in.logp_old.push_back(-1e300);
          in.logp_behavior.push_back(kNaN);
          in.logp_ref.push_back(1e300);
        }
      const LossResult a = policy_loss(base, c), b = policy_loss(padded, c);
      EXPECT_EQ(a.loss, b.loss) << level << " " << agg;
      EXPECT_EQ(a.normaliser, b.normaliser) << level << " " << agg;
      EXPECT_EQ(a.clip_fraction, b.clip_fraction) << level << " " << agg;
      EXPECT_EQ(a.kl, b.kl) << level << " " << agg;
      EXPECT_EQ(a.tis_mean, b.tis_mean) << level << " " << agg;
      for (size_t i = 0; i < base.size(); ++i) {
        for (size_t t = 0; t < base[i].mask.size(); ++t)
          EXPECT_EQ(a.grad[i][t], b.grad[i][t]) << level << " " << agg << " " << i << " " << t;
        for (size_t t = base[i].mask.size(); t < padded[i].mask.size(); ++t)
          EXPECT_EQ(b.grad[i][t], 0.0);
      }
    }
}

// §7.6 item 11: truncated importance sampling.
TEST(RlPitfalls, P11_Tis) {
  std::vector<LossInput> batch = random_batch(13, false);
  for (LossInput& in : batch) in.logp_behavior = in.logp_old;
  LossConfig cfg;
  const LossResult plain = policy_loss(batch, cfg);
  cfg.tis_cap = 2;
  for (const char* mode : {"truncate", "mask"}) {
    cfg.tis_mode = mode;
    const LossResult r = policy_loss(batch, cfg);
    EXPECT_EQ(r.tis_mean, 1.0) << mode;
    EXPECT_EQ(r.loss, plain.loss) << mode;
    EXPECT_EQ(r.grad, plain.grad) << mode;
  }
  // A large mismatch: w is capped at C (truncate) or the token is dropped (mask).
  LossInput in = flat_input({1, 1}, {1.0, 1.0});
  in.logp_behavior = {-3.0, 1.0};  // exp(logp_old - logp_behavior) = {e^3, e^-1}
  cfg.tis_mode = "truncate";
  LossResult r = policy_loss({in}, cfg);
  EXPECT_NEAR(r.tis_mean, (2.0 + std::exp(-1.0)) / 2.0, 1e-15);
  EXPECT_NEAR(r.loss, -(2.0 + std::exp(-1.0)) / 2.0, 1e-15);
  EXPECT_NEAR(r.grad[0][0], -2.0 / 2.0, 1e-15);
  EXPECT_NEAR(r.grad[0][1], -std::exp(-1.0) / 2.0, 1e-15);
  cfg.tis_mode = "mask";
  r = policy_loss({in}, cfg);
  EXPECT_EQ(r.tis_mean, 0.5);
  EXPECT_EQ(r.loss, -0.5);  // the dropped token still counts in Σ mask
  EXPECT_EQ(r.grad[0][0], 0.0);
  EXPECT_EQ(r.grad[0][1], -0.5);
}

// §7.6 item 12: the k3 KL estimator.
TEST(RlPitfalls, P12_Kl) {
  for (double a = -15.0; a <= 15.0; a += 0.37)
    for (double b = -15.0; b <= 15.0; b += 0.41) {
      EXPECT_GE(k3(a, b), 0.0) << a << " " << b;
      EXPECT_EQ(k3(a, a), 0.0) << a;
    }
  for (double x : {1e-12, -1e-12, 1e-8, -1e-8}) EXPECT_GE(k3(0.0, x), 0.0) << x;
  EXPECT_NEAR(k3(0.0, 1.0), std::exp(1.0) - 2.0, 1e-15);
  EXPECT_NEAR(k3(-2.0, -2.5), std::exp(-0.5) - 0.5, 1e-15);
  EXPECT_NEAR(k3(0.0, 30.0), std::exp(10.0) - 11.0, 1e-9);  // clamped to x = 10
  EXPECT_NEAR(k3(0.0, -30.0), std::exp(-10.0) + 9.0, 1e-12);

  // θ = ref: the KL term adds exactly 0 to loss and gradient.
  std::vector<LossInput> batch = random_batch(17, false);
  for (LossInput& in : batch) in.logp_ref = in.logp;
  LossConfig cfg;
  const LossResult off = policy_loss(batch, cfg);
  cfg.kl_beta = 0.04;
  const LossResult on = policy_loss(batch, cfg);
  EXPECT_EQ(on.loss, off.loss);
  EXPECT_EQ(on.grad, off.grad);
  EXPECT_EQ(on.kl, 0.0);
  // θ ≠ ref: the loss adds β · mean D under token_mean.
  LossInput in = flat_input({1, 0, 1}, {0.0, 0.0, 0.0});
  in.logp_ref = {1.0, 0.0, -0.5};
  const LossResult k = policy_loss({in}, cfg);
  const double D = (std::exp(1.0) - 2.0 + std::exp(-0.5) - 0.5) / 2.0;
  EXPECT_NEAR(k.kl, D, 1e-15);
  EXPECT_NEAR(k.loss, 0.04 * D, 1e-15);
  EXPECT_NEAR(k.grad[0][0], 0.04 * (1.0 - std::exp(1.0)) / 2.0, 1e-15);
  EXPECT_NEAR(k.grad[0][2], 0.04 * (1.0 - std::exp(-0.5)) / 2.0, 1e-15);
}

// §7.6 item 13: GSPO's sequence ratio is exp(mean log-ratio), clipped once per sequence.
TEST(RlPitfalls, P13_Gspo) {
  LossInput in = flat_input({1, 1, 0, 1}, {1.0, 1.0, 9.0, 1.0});
  in.logp = {0.1, -0.3, kNaN, 0.5};  // log-ratios; mean over mask-1 tokens 0.1
  LossConfig cfg;
  cfg.ratio_level = "sequence";
  cfg.eps_low = cfg.eps_high = 0.2;
  const double rho = std::exp(0.1);
  LossResult r = policy_loss({in}, cfg);
  EXPECT_NEAR(r.loss, -rho, 1e-15);
  for (size_t t : {0, 1, 3}) EXPECT_NEAR(r.grad[0][t], -rho / 3.0, 1e-15) << t;
  EXPECT_EQ(r.grad[0][2], 0.0);
  EXPECT_EQ(r.clip_fraction, 0.0);  // token 3's own ratio e^0.5 would be clipped
  cfg.ratio_level = "token";
  const LossResult tok = policy_loss({in}, cfg);
  EXPECT_NEAR(tok.clip_fraction, 1.0 / 3.0, 1e-15);
  EXPECT_NEAR(tok.loss, -(std::exp(0.1) + std::exp(-0.3) + 1.2) / 3.0, 1e-15);

  // Sequence clip: ρ = e^0.1 > 1 + 0.05 with A > 0 clips the whole sequence.
  cfg.ratio_level = "sequence";
  cfg.eps_high = 0.05;
  r = policy_loss({in}, cfg);
  EXPECT_NEAR(r.loss, -1.05, 1e-15);
  for (double g : r.grad[0]) EXPECT_EQ(g, 0.0);
  EXPECT_EQ(r.clip_fraction, 1.0);
  // clip_fraction counts samples: a second, unclipped one-token sample makes it 1/2 (not 3/4).
  LossInput other = flat_input({0, 1}, {0.0, -1.0});
  r = policy_loss({in, other}, cfg);
  EXPECT_EQ(r.clip_fraction, 0.5);
  EXPECT_NEAR(r.loss, (-1.05 * 3 + 1.0) / 4.0, 1e-15);
  EXPECT_NEAR(r.grad[1][1], 1.0 / 4.0, 1e-15);
}

// §7.6 item 14: stale trajectories are rejected or down-weighted.
TEST(RlPitfalls, P14_Staleness) {
  for (const char* mode : {"reject", "downweight"})
    for (int64_t s = 0; s <= 2; ++s) EXPECT_EQ(staleness_weight(s, 2, mode), 1.0) << mode;
  EXPECT_EQ(staleness_weight(3, 2, "reject"), 0.0);
  EXPECT_EQ(staleness_weight(100, 2, "reject"), 0.0);
  EXPECT_EQ(staleness_weight(3, 2, "downweight"), 0.5);
  EXPECT_EQ(staleness_weight(5, 2, "downweight"), 0.125);
  EXPECT_EQ(staleness_weight(1, 0, "reject"), 0.0);
  expect_invalid([] { staleness_weight(3, 2, "drop"); }, "staleness_mode");
  expect_invalid([] { staleness_weight(-1, 2, "reject"); }, "staleness");
}

// Clip-higher (ε_lo = 0.2, ε_hi = 0.28) and the dual clip (c = 3, A < 0) on hand numbers.
TEST(RlLoss, ClipHigherAndDualClipHandExample) {
  LossInput in = flat_input({1, 1, 1, 1}, {1.0, -1.0, -1.0, -1.0});
  in.logp = {0.3, -0.3, 0.5, 1.5};  // ρ = {e^0.3 > 1.28, e^-0.3 < 0.8, e^0.5, e^1.5 > 3}
  LossConfig cfg;
  LossResult r = policy_loss({in}, cfg);
  EXPECT_NEAR(r.loss, (-1.28 + 0.8 + std::exp(0.5) + std::exp(1.5)) / 4.0, 1e-15);
  EXPECT_EQ(r.grad[0][0], 0.0);
  EXPECT_EQ(r.grad[0][1], 0.0);
  EXPECT_NEAR(r.grad[0][2], std::exp(0.5) / 4.0, 1e-15);
  EXPECT_NEAR(r.grad[0][3], std::exp(1.5) / 4.0, 1e-15);
  EXPECT_EQ(r.clip_fraction, 0.5);
  cfg.dual_clip = 3;
  r = policy_loss({in}, cfg);
  EXPECT_NEAR(r.loss, (-1.28 + 0.8 + std::exp(0.5) + 3.0) / 4.0, 1e-15);
  EXPECT_NEAR(r.grad[0][2], std::exp(0.5) / 4.0, 1e-15);
  EXPECT_EQ(r.grad[0][3], 0.0);  // capped at -c·A
  EXPECT_EQ(r.clip_fraction, 0.75);
}

// dL/dlogp against central differences of the loss, over every switch combination.
TEST(RlLoss, GradMatchesFiniteDifferences) {
  uint64_t seed = 100;
  int checked = 0, saw_clip = 0;
  for (const char* level : {"token", "sequence"})
    for (double dual : {0.0, 3.0})
      for (int tis = 0; tis < 3; ++tis)
        for (double beta : {0.0, 0.05})
          for (const char* agg : {"token_mean", "constant", "seq_mean"}) {
            LossConfig cfg;
            cfg.ratio_level = level;
            cfg.dual_clip = dual;
            cfg.tis_cap = tis ? 2.0 : 0.0;
            cfg.tis_mode = tis == 2 ? "mask" : "truncate";
            cfg.kl_beta = beta;
            cfg.loss_agg = agg;
            const bool seq = std::string(level) == "sequence";
            // Sequence level: enough samples that some land outside the clip range.
            std::vector<LossInput> batch = random_batch(seed++, seq, seq ? 8 : 4);
            const LossResult r = policy_loss(batch, cfg);
            if (r.clip_fraction > 0 && r.clip_fraction < 1) ++saw_clip;
            const double h = 1e-6;
            for (size_t i = 0; i < batch.size(); ++i)
              for (size_t t = 0; t < batch[i].mask.size(); ++t) {
                if (!batch[i].mask[t]) {
                  EXPECT_EQ(r.grad[i][t], 0.0);
                  continue;
                }
                const double x = batch[i].logp[t];
                batch[i].logp[t] = x + h;
                const double up = policy_loss(batch, cfg).loss;
                batch[i].logp[t] = x - h;
                const double down = policy_loss(batch, cfg).loss;
                batch[i].logp[t] = x;
                const double fd = (up - down) / (2 * h), g = r.grad[i][t];
                EXPECT_NEAR(g, fd, 1e-5 * std::max(std::abs(g), 1e-3))
                    << level << " dual " << dual << " tis " << tis << " beta " << beta << " " << agg
                    << " sample " << i << " t " << t;
                ++checked;
              }
          }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(saw_clip, 40);  // the inputs exercise both clipped and unclipped branches
}

TEST(RlLoss, BadConfigNamesTheField) {
  const std::vector<LossInput> batch = {flat_input({1, 1}, {1.0, -1.0})};
  auto with = [&](const std::function<void(LossConfig&)>& set, const std::string& needle) {
    LossConfig cfg;
    set(cfg);
    expect_invalid([&] { policy_loss(batch, cfg); }, needle);
  };
  with([](LossConfig& c) { c.ratio_level = "seq"; }, "ratio_level: unknown mode 'seq'");
  with([](LossConfig& c) { c.tis_mode = "mis"; }, "tis_mode: unknown mode 'mis'");
  with([](LossConfig& c) { c.loss_agg = "bogus"; },
       "loss_agg: unknown mode 'bogus' (token_mean, constant, seq_mean)");
  with([](LossConfig& c) { c.eps_low = 1.5; }, "eps_low");
  with([](LossConfig& c) { c.eps_high = -0.1; }, "eps_high");
  with([](LossConfig& c) { c.dual_clip = 0.5; }, "dual_clip");
  with([](LossConfig& c) { c.tis_cap = -1; }, "tis_cap");
  with([](LossConfig& c) { c.kl_beta = -1; }, "kl_beta");
  with([](LossConfig& c) { c.max_len = -1; }, "max_len");

  std::vector<LossInput> bad = batch;
  bad[0].logp_old.pop_back();
  expect_invalid([&] { policy_loss(bad, LossConfig{}); }, "logp_old");
  bad = batch;
  bad[0].logp_ref.clear();  // unused without KL: fine; required with it
  EXPECT_NO_THROW(policy_loss(bad, LossConfig{}));
  LossConfig kl;
  kl.kl_beta = 0.01;
  expect_invalid([&] { policy_loss(bad, kl); }, "logp_ref");

  const Sample s = make_sample({1, 1}, {0}, {}, 1.0);
  expect_invalid([&] { gae(s, {0.0, 0.0}, 1.0, 1.0); }, "turn");
  const Sample ok = make_sample({1, 1}, {0, 0}, {}, 1.0);
  expect_invalid([&] { gae(ok, {0.0}, 1.0, 1.0); }, "values");
  expect_invalid([&] { group_advantages({ok, s}, AdvantageConfig{}); }, "turn");
  AdvantageConfig neg;
  neg.eps = -1;
  expect_invalid([&] { group_advantages({ok}, neg); }, "eps");
}

}  // namespace
}  // namespace myriad::train::rl
