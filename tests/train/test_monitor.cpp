// Training monitors (TRAINING.md §4) on hand-computable inputs: load statistics and quantiles,
// dead experts over the window, bias spread, the three routing entropies and the probe flip
// rate, gradient jitter / cv100 / spikes (global and per group), loss z-scores, spike records
// and the Apply / Skip / Rollback policy.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "train/monitor.h"

using namespace myriad;
using namespace myriad::train;

namespace {
LayerRouting layer(int64_t i, std::vector<int64_t> counts, int64_t m, int64_t k) {
  LayerRouting r;
  r.layer = i;
  r.counts = std::move(counts);
  r.tokens = m;
  r.top_k = k;
  return r;
}
StepStats stats(int64_t step, double loss, double g) {
  StepStats s;
  s.step = step;
  s.loss = loss;
  s.grad_norm = g;
  return s;
}
}  // namespace

TEST(Monitor, ExpertLoadStatistics) {
  Monitor mon;
  StepStats s = stats(0, 2.0, 1.0);
  s.layers.push_back(layer(3, {2, 4, 6, 8}, 5, 4));  // q = 5: loads 0.4 0.8 1.2 1.6
  s.layers.back().bias = {-0.5, 0.0, 0.25, 0.25};
  auto m = mon.step(s);
  EXPECT_DOUBLE_EQ(m["layer3/load/max_over_mean"], 1.6);
  EXPECT_NEAR(m["layer3/load/maxvio"], 0.6, 1e-12);
  EXPECT_DOUBLE_EQ(m["layer3/load/min_over_mean"], 0.4);
  EXPECT_NEAR(m["layer3/load/cv"], std::sqrt(0.2), 1e-12);
  EXPECT_DOUBLE_EQ(m["layer3/load/q0"], 0.4);
  EXPECT_DOUBLE_EQ(m["layer3/load/q100"], 1.6);
  EXPECT_NEAR(m["layer3/load/q50"], 1.0, 1e-12);
  EXPECT_NEAR(m["layer3/load/q10"], 0.4 + 0.3 * 0.4, 1e-12);  // linear interpolation
  EXPECT_EQ(m["layer3/load/dead"], 0.0);
  const double h =
      -(0.1 * std::log(0.1) + 0.2 * std::log(0.2) + 0.3 * std::log(0.3) + 0.4 * std::log(0.4));
  EXPECT_NEAR(m["layer3/route/load_entropy"], h / std::log(4.0), 1e-12);
  EXPECT_DOUBLE_EQ(m["layer3/bias/min"], -0.5);
  EXPECT_DOUBLE_EQ(m["layer3/bias/max"], 0.25);
  EXPECT_NEAR(m["layer3/bias/std"], std::sqrt((0.25 + 0 + 0.0625 * 2) / 4), 1e-12);
  EXPECT_EQ(m.count("layer3/route/flip_rate"), 0u);  // no probe yet
}

TEST(Monitor, DeadExpertsOverTheWindow) {
  Monitor mon(100);
  for (int t = 0; t < 150; ++t) {
    StepStats s = stats(t, 1.0, 1.0);
    // Expert 0 never routes; expert 1 routes only at step 0; 2 and 3 always.
    s.layers.push_back(layer(0, {0, t == 0 ? 1 : 0, 5, 5}, 10, 1));
    auto m = mon.step(s);
    EXPECT_EQ(m["layer0/load/dead"], t < 100 ? 1.0 : 2.0) << t;
  }
}

TEST(Monitor, RoutingEntropiesAndFlipRate) {
  Monitor mon;
  StepStats s = stats(0, 1.0, 1.0);
  LayerRouting r = layer(0, {2, 2, 2, 2}, 4, 2);
  // Token 0: uniform scores; token 1: all mass on two experts with equal weight.
  r.scores_Nn = Tensor::from_doubles(std::vector<double>{.5, .5, .5, .5, .9, .9, 0, 0}, {2, 4});
  r.selected_Nk = Tensor::from_ints(std::vector<int64_t>{0, 1, 0, 1}, {2, 2});
  s.layers.push_back(r);
  EXPECT_DOUBLE_EQ(mon.probe(0, r.selected_Nk), 0.0);
  auto m = mon.step(s);
  EXPECT_NEAR(m["layer0/route/token_entropy"], (1.0 + 0.5) / 2, 1e-12);  // log 2 / log 4
  EXPECT_NEAR(m["layer0/route/selected_entropy"], 1.0, 1e-12);
  EXPECT_NEAR(m["layer0/route/load_entropy"], 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(m["layer0/route/flip_rate"], 0.0);
  // Reordering slots is no flip; replacing one of 4 assignments is 1/4.
  EXPECT_DOUBLE_EQ(mon.probe(0, Tensor::from_ints(std::vector<int64_t>{1, 0, 0, 1}, {2, 2})), 0.0);
  EXPECT_DOUBLE_EQ(mon.probe(0, Tensor::from_ints(std::vector<int64_t>{1, 0, 0, 3}, {2, 2})), 0.25);
  EXPECT_DOUBLE_EQ(mon.step(s)["layer0/route/flip_rate"], 0.25);
}

TEST(Monitor, GradientJitterAndSpikes) {
  Monitor mon;
  std::map<std::string, double> m;
  for (int t = 0; t < 50; ++t) {  // alternating 1.0 / 1.2: jitter about 1, no spikes
    StepStats s = stats(t, 1.0, t % 2 ? 1.2 : 1.0);
    s.group_norms["router"] = 0.5;
    m = mon.step(s);
    EXPECT_LT(m["grad/jitter"], 4.0);
  }
  EXPECT_EQ(m["grad/spikes"], 0.0);
  EXPECT_EQ(m["grad/router/cv100"], 0.0);  // constant
  EXPECT_EQ(m["grad/router/jitter"], 0.0);
  EXPECT_NEAR(m["grad/cv100"], 0.1 / 1.1, 1e-12);  // std/mean of 25 × 1.0 and 25 × 1.2
  StepStats s = stats(50, 1.0, 100.0);
  s.group_norms["router"] = 0.5;
  m = mon.step(s);
  EXPECT_GT(m["grad/jitter"], 4.0);
  EXPECT_EQ(m["grad/spikes"], 1.0);
  EXPECT_EQ(m["grad/router/spikes"], 0.0);
  // J_t uses μ, σ of the steps before t: by hand for a short series.
  Monitor two;
  two.step(stats(0, 1, 1.0));
  two.step(stats(1, 1, std::exp(1.0)));
  EmaStats e;
  e.push(0.0);
  e.push(1.0);
  EXPECT_NEAR(two.step(stats(2, 1, std::exp(2.0)))["grad/jitter"],
              std::abs(2.0 - e.mean()) / e.std(), 1e-9);
  EXPECT_NEAR(e.mean(), 0.01 / (1 - 0.99 * 0.99), 1e-12);  // bias-corrected EMA of {0, 1}
  EXPECT_NEAR(e.std(), 1.0, 1e-12);                        // one squared deviation, 1
}

TEST(Monitor, LossSpikesAndPolicy) {
  Monitor mon;
  for (int t = 0; t < 60; ++t) {
    const double loss = 3.0 + (t % 2 ? 0.01 : -0.01);
    EXPECT_EQ(mon.decide(loss, 1.0), Decision::Apply);
    mon.step(stats(t, loss, 1.0));
  }
  EXPECT_TRUE(mon.spikes().empty());
  // z ≈ 5 and L > 1.1 median: a logged spike, but applied (z ≤ 6).
  StepStats s = stats(60, 3.0 + 5 * 0.01, 1.0);
  EXPECT_EQ(mon.decide(s.loss, 1.0), Decision::Apply);
  auto m = mon.step(s);
  EXPECT_GT(m["loss/z"], 4.0);
  EXPECT_EQ(m["loss/spikes"], 0.0);  // 3.05 is not > 1.1 × 3
  s = stats(61, 4.0, 1.0);
  s.shard = 7;
  s.sequence_ids = {11, 12};
  EXPECT_EQ(mon.decide(s.loss, 1.0), Decision::Skip);  // z ≫ 6
  m = mon.step(s);
  ASSERT_EQ(mon.spikes().size(), 1u);
  EXPECT_EQ(mon.spikes()[0].step, 61);
  EXPECT_EQ(mon.spikes()[0].shard, 7);
  EXPECT_EQ(mon.spikes()[0].sequence_ids, (std::vector<int64_t>{11, 12}));
  EXPECT_EQ(m["loss/spikes"], 1.0);
  // Non-finite loss or gradient: skip; the third consecutive skip rolls back.
  const double nan = std::numeric_limits<double>::quiet_NaN();
  EXPECT_EQ(mon.decide(nan, 1.0), Decision::Skip);
  EXPECT_EQ(mon.decide(3.0, std::numeric_limits<double>::infinity()), Decision::Rollback);
  EXPECT_EQ(mon.decide(3.0, 1.0), Decision::Apply);  // the skipped 4.0 did not move the EMA
  EXPECT_EQ(mon.decide(nan, 1.0), Decision::Skip);
  m = mon.step(stats(62, 3.0, 1.0));
  EXPECT_EQ(m["loss/skips"], 4.0);
  EXPECT_EQ(m["loss/rollbacks"], 1.0);
  EXPECT_EQ(mon.skips(), 4);
}

TEST(Monitor, RejectsBadInput) {
  Monitor mon;
  StepStats s = stats(0, 1, 1);
  s.layers.push_back(layer(0, {1}, 1, 1));
  EXPECT_THROW(mon.step(s), std::exception);
  EXPECT_THROW(mon.probe(0, Tensor::zeros({4}, DType::I64)), std::exception);
}

// state() / load_state(): a monitor restored from JSON (as a checkpoint carries it) reports
// exactly what the original does on the following steps, spikes, windows and probes included.
TEST(Monitor, StateRoundTripContinuesExactly) {
  auto feed = [](Monitor& m, int64_t from, int64_t to) {
    std::vector<std::map<std::string, double>> out;
    for (int64_t t = from; t < to; ++t) {
      StepStats s = stats(t, 3.0 - 0.01 * t + (t == 12 ? 2.0 : 0.0), 1.0 + 0.1 * (t % 3));
      s.group_norms["router"] = 0.1 * (1 + t % 2);
      s.layers.push_back(layer(1, {t % 4 == 0 ? 0 : 10, 5, 3, 14}, 16, 2));
      m.decide(s.loss, s.grad_norm);
      m.probe(1, Tensor::from_ints(std::vector<int64_t>{t % 4, 1, 2, 3}, {2, 2}));
      out.push_back(m.step(s));
    }
    return out;
  };
  Monitor a(8), b(8);
  feed(a, 0, 20);
  const auto head = feed(b, 0, 10);
  Monitor c(100);  // the window comes from the state
  c.load_state(nlohmann::json::parse(b.state().dump()));
  EXPECT_EQ(c.state(), b.state());
  const auto want = feed(b, 10, 20), got = feed(c, 10, 20);
  EXPECT_EQ(got, want);
  EXPECT_EQ(c.state(), a.state());
  EXPECT_EQ(c.spikes().size(), a.spikes().size());
  EXPECT_GE(a.spikes().size(), 1u);
}
