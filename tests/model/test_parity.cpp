// Parity with the transformers 5.24 fixtures (tests/fixtures/models/*, docs/REFERENCE_NOTES.md):
// logits and every per-layer tensor of the forward, the shifted next-token loss and the listed
// gradients (autograd through the whole model), and greedy generation through the decode cache.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "core/autograd.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "tests/model/model_test_util.h"

namespace myriad::model {
namespace {

double max_abs(const Tensor& a) {
  double m = 0;
  for (double v : a.to_doubles()) m = std::max(m, std::abs(v));
  return m;
}

class Parity : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    dir_ = fixture_dir(GetParam());
    in_ = safetensors::open(dir_ + "/inputs.safetensors");
    out_ = safetensors::open(dir_ + "/outputs.safetensors");
  }
  Tensor expected(const std::string& n) const { return out_.load(n); }
  std::string dir_;
  safetensors::SafetensorsFile in_, out_;
};

TEST_P(Parity, ForwardLogitsAndLayers) {
  Decoder m = Decoder::load(dir_);
  NoGradGuard ng;
  ForwardOutput f = m.forward(in_.load("input_ids"), nullptr, {.logits = true, .record = true});
  const double dl = max_abs_diff(f.logits_BTV, expected("logits"));
  EXPECT_LE(dl, 1e-4);
  double dh = 0;
  for (int64_t i = 0; i < m.config().num_hidden_layers; ++i) {
    SCOPED_TRACE("layer " + std::to_string(i));
    const std::string s = std::to_string(i);
    EXPECT_LE(max_abs_diff(f.attn_out[i], expected("attn_out." + s)), 1e-4);
    EXPECT_LE(max_abs_diff(f.ffn_out[i], expected("ffn_out." + s)), 1e-4);
    dh = std::max(dh, max_abs_diff(f.hidden[i], expected("hidden." + s)));
    EXPECT_LE(dh, 1e-4);
  }
  std::printf("%s: logits max err %.3g, hidden max err %.3g\n", GetParam().c_str(), dl, dh);
}

TEST_P(Parity, LossAndGradients) {
  Decoder m = Decoder::load(dir_);
  m.weights().requires_grad_(true);
  Tensor loss = m.loss(in_.load("input_ids"));
  const double dloss = std::abs(loss.item() - expected("loss").item());
  EXPECT_LE(dloss, 1e-5);
  loss.backward();
  int checked = 0;
  double worst = 0;
  for (const auto& n : out_.names()) {
    if (n.rfind("grad.", 0) != 0) continue;
    const std::string name = m.weights().canonical(n.substr(5));
    SCOPED_TRACE(name);
    Tensor g = m.weights().get(name).grad();
    ASSERT_TRUE(g.defined());
    Tensor e = expected(n);
    const double dg = max_abs_diff(g, e);
    EXPECT_LE(dg, std::max(1e-5, 1e-3 * max_abs(e)));
    worst = std::max(worst, dg / max_abs(e));
    ++checked;
  }
  std::printf("%s: loss err %.3g, %d gradients, worst err / max %.3g\n", GetParam().c_str(), dloss,
              checked, worst);
  EXPECT_GE(checked, 4);
}

TEST_P(Parity, GreedyGeneration) {
  Decoder m = Decoder::load(dir_);
  Tensor ids = in_.load("input_ids");
  const int64_t T = ids.size(1);
  std::vector<int64_t> row0 = ids.to_ints();
  row0.resize(T);
  auto gen = m.generate_greedy(Tensor::from_ints(row0, {1, T}), 8);
  EXPECT_EQ(gen.ids, expected("greedy_ids").to_ints());
  Tensor want = expected("greedy_logits");
  for (int64_t k = 0; k < 8; ++k) {
    SCOPED_TRACE("step " + std::to_string(k));
    std::vector<double> all = want.to_doubles();
    const int64_t V = want.size(1);
    std::vector<double> r(all.begin() + k * V, all.begin() + (k + 1) * V);
    EXPECT_LE(max_abs_diff(gen.step_logits[k], Tensor::from_doubles(r, {V})), 1e-4);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Parity,
                         ::testing::Values("kimi_linear_tiny", "kimi_linear_tiny_rope0",
                                           "deepseek_v3_tiny"));

TEST(Rope, YarnMatchesDeepSeekV3TestVector) {
  // MODEL.md §3.4: d_pe 64, base 1e4, s 40, L0 4096, β 32/1 -> low 10, high 23, τ' = 0.1352338.
  const ModelConfig c = deepseek_v3();
  const Rope r = Rope::from(c);
  ASSERT_EQ(r.inv_freq.size(), 32u);
  for (int64_t i = 0; i < 32; ++i) {
    const double theta = std::pow(1e4, -2.0 * i / 64), ramp = std::clamp((i - 10) / 13.0, 0.0, 1.0);
    EXPECT_NEAR(r.inv_freq[i], theta * (1 - ramp) + theta / 40 * ramp, 1e-15) << i;
  }
  EXPECT_DOUBLE_EQ(r.attention_factor, 1.0);  // mscale == mscale_all_dim
  Weights none;
  EXPECT_NEAR(MlaLayer(c, &none, 0).softmax_scale(), 0.1352338, 5e-7);
  // kimi_linear is NoPE: τ has no mscale whatever rope_scaling says.
  ModelConfig k = kimi_linear_48b();
  k.rope_scaling = c.rope_scaling;
  EXPECT_NEAR(MlaLayer(k, &none, 0).softmax_scale(), 1 / std::sqrt(192.0), 1e-12);
}

}  // namespace
}  // namespace myriad::model
