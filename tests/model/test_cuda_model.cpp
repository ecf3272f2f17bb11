// The model on a CUDA device (skipped without one): a K3 model (KDA + dense, KDA + LatentMoE,
// MLA + LatentMoE, AttnRes, SiTU) and a DeepSeek-V3-form one with weights on cuda:0 give the CPU
// model's logits, loss gradients and cached decode. Every op of the forward and backward runs
// its CUDA kernel; the MoE's routing bookkeeping still reads indices back to the host.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tests/model/model_test_util.h"

namespace myriad::model {
namespace {

// max |a - b| / max(1, max |b|).
double rel_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to(kCPU).to_doubles(), y = b.to(kCPU).to_doubles();
  EXPECT_EQ(x.size(), y.size());
  double m = 0, s = 1;
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i) {
    m = std::max(m, std::abs(x[i] - y[i]));
    s = std::max(s, std::abs(y[i]));
  }
  return m / s;
}

class CudaModel : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!has_allocator(DeviceType::CUDA)) GTEST_SKIP() << "no CUDA device visible";
  }
};

void expect_gpu_matches_cpu(const ModelConfig& c, uint64_t seed) {
  Decoder cpu = random_model(c, DType::F32, seed);
  Decoder gpu(c, cpu.weights().to(cuda(0)));
  Generator gen(seed + 7);
  const Tensor ids = gen.randint({2, 13}, 0, c.vocab_size);
  {
    NoGradGuard ng;
    const Tensor lc = cpu.forward(ids).logits_BTV;
    const Tensor lg = gpu.forward(ids.to(cuda(0))).logits_BTV;
    EXPECT_EQ(lg.device(), cuda(0));
    EXPECT_LE(rel_diff(lg, lc), 1e-4) << "forward logits";
  }
  cpu.weights().requires_grad_(true);
  gpu.weights().requires_grad_(true);
  Tensor loss_c = cpu.loss(ids), loss_g = gpu.loss(ids.to(cuda(0)));
  EXPECT_NEAR(loss_g.to(kCPU).item(), loss_c.item(), 1e-4 * std::max(1.0, loss_c.item()));
  loss_c.backward();
  loss_g.backward();
  int compared = 0;
  for (const auto& s : cpu.weights().specs()) {
    const Tensor gc = cpu.weights().get(s.name).grad();
    const Tensor gg = gpu.weights().get(s.name).grad();
    ASSERT_EQ(gc.defined(), gg.defined()) << s.name;
    if (!gc.defined()) continue;
    EXPECT_EQ(gg.device(), cuda(0)) << s.name;
    EXPECT_LE(rel_diff(gg, gc), 1e-3) << "gradient of " << s.name;
    ++compared;
  }
  EXPECT_GT(compared, 10);
  // Prefill 5 tokens, then one-token steps through the cache, on the GPU.
  NoGradGuard ng;
  const Tensor idg = ids.to(cuda(0));
  const Tensor full = gpu.forward(idg).logits_BTV;
  DecodeCache cache = gpu.new_cache();
  std::vector<Tensor> parts = {
      gpu.forward(ops::contiguous(ops::slice(idg, 1, 0, 5)), &cache).logits_BTV};
  for (int64_t t = 5; t < idg.size(1); ++t)
    parts.push_back(gpu.forward(ops::contiguous(ops::slice(idg, 1, t, t + 1)), &cache).logits_BTV);
  EXPECT_LE(rel_diff(ops::concat(parts, 1), full), 1e-4) << "cached decode vs full forward";
}

TEST_F(CudaModel, K3ForwardGradientsAndDecodeMatchCpu) {
  expect_gpu_matches_cpu(k3_three_layer_config(), 21);
}

TEST_F(CudaModel, PreNormSwigluFormMatchesCpu) {
  ModelConfig c = three_layer_config(0);  // pre-norm residuals, SwiGLU, softplus KDA gate
  c.hidden_act = "silu";
  c.linear_attn_config.gate_lower_bound.reset();
  c.linear_attn_config.use_full_rank_gate = false;
  c.validate();
  expect_gpu_matches_cpu(c, 31);
}

TEST_F(CudaModel, GreedyGenerationEqualsCpu) {
  const ModelConfig c = k3_three_layer_config();
  Decoder cpu = random_model(c, DType::F32, 41);
  Decoder gpu(c, cpu.weights().to(cuda(0)));
  Generator gen(42);
  const Tensor prompt = gen.randint({1, 6}, 0, c.vocab_size);
  const auto a = cpu.generate_greedy(prompt, 12), b = gpu.generate_greedy(prompt.to(cuda(0)), 12);
  EXPECT_EQ(a.ids, b.ids);
}

// Weight-only int8 / int4 on the device: a GPU model quantized in place, and the CPU model's
// quantized copies moved with its weights, decode token by token with the CPU's quantized
// logits (the codes are the same; the device's product sums in its own order).
TEST_F(CudaModel, QuantizedDecodeMatchesCpu) {
  const ModelConfig c = k3_three_layer_config();
  for (int bits : {8, 4}) {
    Decoder cpu = random_model(c, DType::F32, 51);
    Decoder gpu(c, cpu.weights().to(cuda(0)));
    EXPECT_GT(cpu.quantize(bits), 0);
    EXPECT_GT(gpu.quantize(bits), 0);
    Decoder moved(c, cpu.weights().to(cuda(0)));
    NoGradGuard ng;
    Generator gen(52);
    const Tensor ids = gen.randint({1, 9}, 0, c.vocab_size);
    DecodeCache cc = cpu.new_cache(), cg = gpu.new_cache(), cm = moved.new_cache();
    for (int64_t t = 0; t < ids.size(1); ++t) {
      const Tensor tok = ops::contiguous(ops::slice(ids, 1, t, t + 1));
      const Tensor lc = cpu.forward(tok, &cc).logits_BTV;
      const Tensor lg = gpu.forward(tok.to(cuda(0)), &cg).logits_BTV;
      const Tensor lm = moved.forward(tok.to(cuda(0)), &cm).logits_BTV;
      EXPECT_EQ(lg.device(), cuda(0));
      EXPECT_LE(rel_diff(lg, lc), 1e-4) << bits << " bits, quantized on the device, step " << t;
      EXPECT_LE(rel_diff(lm, lc), 1e-4) << bits << " bits, moved codes, step " << t;
    }
  }
}

}  // namespace
}  // namespace myriad::model
