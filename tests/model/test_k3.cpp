// The K3 forms that transformers lacks (MODEL.md §3.2 output gate, §4.2 lower-bound gate, §4.6
// full-rank output gate, §6 LatentMoE, §7 Block AttnRes, §8 SiTU-GLU), checked by properties:
// a K3 model builds and trains (forward + backward), an f64 finite-difference gradient check on
// parameters of every K3 component, decode through the cache equals the full forward, and the
// weight store's round trip and errors.
#include <gtest/gtest.h>

#include <unistd.h>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "core/autograd.h"
#include "core/random.h"
#include "io/safetensors.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "tests/model/model_test_util.h"

namespace myriad::model {
namespace {

namespace fs = std::filesystem;

Tensor token_ids(int64_t B, int64_t T, int64_t V, uint64_t seed) {
  Generator gen(seed);
  return gen.randint({B, T}, 0, V);
}

TEST(K3, TinyPresetTrainsForwardBackward) {
  const ModelConfig c = tiny();
  ASSERT_TRUE(c.uses_attn_res() && c.uses_latent_moe() && c.hidden_act == "situ" &&
              c.linear_attn_config.gate_lower_bound);
  Decoder m = Decoder::random(c, 1);
  m.weights().requires_grad_(true);
  Tensor loss = m.loss(token_ids(2, 24, c.vocab_size, 2));
  // Random init at std 0.02: the prediction is near uniform.
  EXPECT_NEAR(loss.item(), std::log(static_cast<double>(c.vocab_size)), 0.05);
  loss.backward();
  int with_grad = 0;
  for (const auto& s : m.weights().specs()) {
    if (!s.trainable) continue;
    Tensor g = m.weights().get(s.name).grad();
    if (!g.defined()) {
      // Only routed experts no token picked, and layer 0's attention AttnRes pair (the exact K3
      // path feeds layer 0 the embedding directly), may lack a gradient.
      EXPECT_TRUE(s.name.find(".experts.") != std::string::npos ||
                  s.name.rfind("model.layers.0.self_attention_res_", 0) == 0)
          << s.name;
      continue;
    }
    for (double v : g.to_doubles()) ASSERT_TRUE(std::isfinite(v)) << s.name;
    ++with_grad;
  }
  EXPECT_GT(with_grad, 100);
}

TEST(K3, GradcheckF64) {
  const ModelConfig c = k3_three_layer_config();
  Decoder m = random_model(c, DType::F64, 3);
  const Tensor ids = token_ids(2, 6, c.vocab_size, 4);
  const Tensor R = Generator(5).normal({2, 6, c.vocab_size}, 0.0, 1.0, DType::F64);
  auto f = [&] { return ops::sum(ops::mul(m.forward(ids).logits_BTV, R)); };
  m.weights().requires_grad_(true);
  f().backward();
  const char* names[] = {
      "model.layers.0.self_attn.A_log",  // lower-bound gate
      "model.layers.0.self_attn.dt_bias",
      "model.layers.0.self_attn.g_proj.weight",  // full-rank KDA output gate
      "model.layers.0.self_attn.q_conv1d.weight",
      "model.layers.0.mlp.gate_proj.weight",            // SiTU-GLU dense
      "model.layers.0.mlp_res_proj.weight",             // layer 0's attention pair is never used
      "model.layers.1.self_attention_res_proj.weight",  // AttnRes over a completed block
      "model.layers.1.mlp_res_norm.weight",
      "model.layers.1.block_sparse_moe.gate.weight",                     // router (through p)
      "model.layers.1.block_sparse_moe.routed_expert_down_proj.weight",  // latent MoE
      "model.layers.1.block_sparse_moe.routed_expert_norm.weight",
      "model.layers.1.block_sparse_moe.routed_expert_up_proj.weight",
      "model.layers.1.block_sparse_moe.shared_experts.up_proj.weight",
      "model.layers.2.self_attn.g_proj.weight",  // MLA output gate
      "model.layers.2.self_attn.q_a_proj.weight",
      "model.layers.2.self_attn.kv_b_proj.weight",
      "model.output_attn_res_proj.weight",
      "model.output_attn_res_norm.weight",
  };
  NoGradGuard ng;
  const double h = 1e-6;
  for (const char* name : names) {
    SCOPED_TRACE(name);
    const Tensor& p = m.weights().get(name);
    const std::vector<double> grad = p.grad().to_doubles();
    double* data = p.data<double>();
    for (int64_t e : {int64_t{0}, p.numel() / 2, p.numel() - 1}) {
      const double x0 = data[e];
      data[e] = x0 + h;
      const double up = f().item();
      data[e] = x0 - h;
      const double down = f().item();
      data[e] = x0;
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(fd, grad[e], 1e-6 * std::max(1.0, std::abs(fd))) << "element " << e;
    }
  }
}

// Max |Δ| between the full forward's logits and a prefill of the first `prefill` tokens followed by
// one-token steps through the cache.
double decode_vs_full(const Decoder& m, const Tensor& ids, int64_t prefill) {
  NoGradGuard ng;
  const Tensor full = m.forward(ids).logits_BTV;
  DecodeCache cache = m.new_cache();
  std::vector<Tensor> parts = {
      m.forward(ops::contiguous(ops::slice(ids, 1, 0, prefill)), &cache).logits_BTV};
  for (int64_t t = prefill; t < ids.size(1); ++t)
    parts.push_back(m.forward(ops::contiguous(ops::slice(ids, 1, t, t + 1)), &cache).logits_BTV);
  return max_abs_diff(ops::concat(parts, 1), full);
}

TEST(K3, DecodeEqualsFullForward) {
  const ModelConfig c = k3_three_layer_config();
  Decoder m = random_model(c, DType::F32, 6);
  EXPECT_LE(decode_vs_full(m, token_ids(2, 11, c.vocab_size, 7), 4), 1e-4);
}

// Weight-only int8 / int4 inference (ops/quant.h) on a K3 model whose projections have input
// dimensions of 32 or 64: the copies cost a quarter (an eighth) of the f32 bytes plus scales;
// decode through the cache (streamed codes) equals the quantized full forward (dequantized GEMMs);
// the logits are the f32 model's on the dequantized weights and track the f32 ones (within
// max_rel of the mean |logit|, top-1 on min_agree of the positions); training through quantized
// weights is refused.
void check_quantized_k3(int bits, double max_rel, double min_agree) {
  ModelConfig c = k3_three_layer_config();
  c.vocab_size = 256, c.hidden_size = 64, c.intermediate_size = 64, c.moe_intermediate_size = 32;
  c.q_lora_rank = 32, c.kv_lora_rank = 32, c.qk_nope_head_dim = 16, c.qk_rope_head_dim = 16;
  c.v_head_dim = 16, c.routed_expert_hidden_size = 32, c.linear_attn_config.head_dim = 32;
  c.validate();
  Decoder m = random_model(c, DType::F32, 11);
  const Tensor ids = token_ids(2, 40, c.vocab_size, 12);
  Tensor f32_logits;
  {
    NoGradGuard ng;
    f32_logits = m.forward(ids).logits_BTV;
  }
  const int64_t n = m.quantize(bits);
  int64_t f32_bytes = 0;
  for (const auto& [name, t] : m.weights().tensors())
    if (m.weights().quant(name)) f32_bytes += t.numel() * 4;
  std::printf("int%d: %lld weights, %lld bytes against %lld f32\n", bits, static_cast<long long>(n),
              static_cast<long long>(m.weights().quant_bytes()), static_cast<long long>(f32_bytes));
  EXPECT_GE(n, 20);
  EXPECT_FALSE(m.weights().quant("model.layers.2.self_attn.kv_b_proj.weight"));
  EXPECT_TRUE(m.weights().quant("lm_head.weight"));
  int64_t experts = 0;  // Kimi's routed experts (w1 / w3 / w2) are quantized too
  for (const auto& [name, t] : m.weights().tensors())
    if (name.find(".experts.") != std::string::npos) {
      EXPECT_TRUE(m.weights().quant(name)) << name;
      ++experts;
    }
  EXPECT_GT(experts, 0);
  EXPECT_NEAR(static_cast<double>(m.weights().quant_bytes()) / f32_bytes, bits / 32.0 + 1.0 / 32,
              1e-9);
  // (Logits up to ~10 on this model, which amplifies rounding: 1.1e-4 in the sanitizer build, whose
  // kernels run without fused multiply-adds.)
  EXPECT_LE(decode_vs_full(m, ids, 20), 1e-3);
  NoGradGuard ng;
  const Tensor full = m.forward(ids).logits_BTV;
  // Against f32: the error relative to the logits' range, and the top-1 token per position.
  // (Mean absolute values: a routing choice that flips moves a few positions' logits a lot.)
  double scale = 0, err = 0;
  const std::vector<double> lq = full.to_doubles(), lf = f32_logits.to_doubles();
  for (size_t i = 0; i < lf.size(); ++i) scale += std::fabs(lf[i]), err += std::fabs(lq[i] - lf[i]);
  const std::vector<int64_t> a = ops::max(full, -1).indices.to_ints(),
                             b = ops::max(f32_logits, -1).indices.to_ints();
  int64_t agree = 0;
  for (size_t i = 0; i < a.size(); ++i) agree += a[i] == b[i];
  std::printf("int%d vs f32 logits: mean |d| %.3g of mean |logit| %.3g; top-1 %lld / %zu\n", bits,
              err / lf.size(), scale / lf.size(), static_cast<long long>(agree), a.size());
  EXPECT_GT(err, 0.0);
  {  // all the difference is quantization's: the f32 model on the dequantized values is the same
    Decoder d = random_model(c, DType::F32, 11);
    for (const auto& [name, t] : m.weights().tensors())
      if (const ops::QuantWeight* q = m.weights().quant(name))
        d.weights().set(name, ops::dequantize(*q));
    EXPECT_LE(max_abs_diff(d.forward(ids).logits_BTV, full), 1e-5);
  }
  EXPECT_LT(err / scale, max_rel);
  EXPECT_GE(static_cast<double>(agree), min_agree * static_cast<double>(a.size()));
  // Training needs gradients: the quantized product refuses an input that requires one.
  set_grad_enabled(true);
  const Tensor x = Tensor::zeros({1, 64}).requires_grad_();
  EXPECT_THROW(project(x, m.weights(), "lm_head.weight"), Error);
  set_grad_enabled(false);
}

TEST(K3, Int8WeightsDecodeAndTrackF32) {
  check_quantized_k3(8, 0.1, 0.85);  // 5.8% and 71-72 / 80 on this model (N(0, 0.3) weights)
}
TEST(K3, Int4WeightsDecodeAndTrackF32) {
  check_quantized_k3(4, 0.8, 0.25);  // 56% and 30 / 80: random weights are int4's worst case
}

TEST(K3, SituFfnMatchesFormula) {
  // The dense FFN with hidden_act situ is W_down SiTU-GLU(W_gate x, W_up x) with β1 = 4 on the
  // gate and β2 = 25 on the up branch (MODEL.md §8).
  ModelConfig c = k3_three_layer_config();
  Decoder m = random_model(c, DType::F64, 8);
  const Weights& w = m.weights();
  const Tensor x = Generator(9).normal({1, 3, c.hidden_size}, 0.0, 3.0, DType::F64);
  DenseFfn ffn(c, &w, 0);
  const std::string p = "model.layers.0.mlp.";
  Tensor g = ops::linear(x, w.get(p + "gate_proj.weight"));
  Tensor u = ops::linear(x, w.get(p + "up_proj.weight"));
  Tensor act = ops::mul(ops::mul(ops::mul(ops::tanh(ops::mul(g, 0.25)), 4.0), ops::sigmoid(g)),
                        ops::mul(ops::tanh(ops::mul(u, 1.0 / 25)), 25.0));
  EXPECT_LE(max_abs_diff(ffn.forward(x), ops::linear(act, w.get(p + "down_proj.weight"))), 1e-12);
}

class WeightsFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("myriad_test_weights_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
};

TEST_F(WeightsFiles, RoundTripAndErrorsNameTheTensor) {
  const ModelConfig c = k3_three_layer_config();
  Decoder m = random_model(c, DType::F32, 10);
  c.save((dir_ / "config.json").string());
  m.weights().save((dir_ / "model.safetensors").string());
  Decoder back = Decoder::load(dir_.string());
  const Tensor ids = token_ids(1, 5, c.vocab_size, 11);
  EXPECT_EQ(max_abs_diff(back.forward(ids).logits_BTV, m.forward(ids).logits_BTV), 0.0);

  auto expect_load_error = [&](std::map<std::string, Tensor> t, const std::string& part) {
    safetensors::save((dir_ / "model.safetensors").string(), t);
    try {
      Decoder::load(dir_.string());
      ADD_FAILURE() << "expected an error naming " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  const std::string victim = "model.layers.2.self_attn.g_proj.weight";
  auto missing = m.weights().tensors();
  missing.erase(victim);
  expect_load_error(missing, victim);
  auto extra = m.weights().tensors();
  extra["model.layers.9.surprise.weight"] = Tensor::zeros({2});
  expect_load_error(extra, "model.layers.9.surprise.weight");
  auto misshaped = m.weights().tensors();
  misshaped[victim] = Tensor::zeros({3, 3});
  expect_load_error(misshaped, victim);
}

TEST(Weights, DenseFfnAcceptsBothSpellings) {
  // transformers 5.24 saves layer 0's dense FFN as block_sparse_moe.*; MODEL.md names it mlp.*.
  const std::string dir =
      std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/models/kimi_linear_tiny";
  auto ck = safetensors::Checkpoint::open(dir);
  ASSERT_TRUE(ck.contains("model.layers.0.block_sparse_moe.gate_proj.weight"));
  Decoder m = Decoder::load(dir);
  EXPECT_TRUE(m.weights().contains("model.layers.0.mlp.gate_proj.weight"));
  EXPECT_EQ(m.weights().canonical("model.layers.0.block_sparse_moe.up_proj.weight"),
            "model.layers.0.mlp.up_proj.weight");
}

}  // namespace
}  // namespace myriad::model

namespace myriad::model {
namespace {

TEST(Weights, FusedExpertLayoutLoads) {
  // MODEL.md §11.2: the MoE under mlp.* with mlp.experts.gate_up_proj [n, 2I, d] (gate rows
  // first) and mlp.experts.down_proj [n, d, I] gives the same model.
  const std::string src =
      std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/models/kimi_linear_tiny";
  const fs::path dir =
      fs::temp_directory_path() / ("myriad_test_fused_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  fs::copy_file(src + "/config.json", dir / "config.json");
  auto ck = safetensors::Checkpoint::open(src);
  std::map<std::string, Tensor> t;
  const ModelConfig c = ModelConfig::load(src);
  for (const auto& n : ck.names()) {
    const auto pos = n.find(".block_sparse_moe.");
    const bool moe_layer = pos != std::string::npos && n.find(".experts.") != std::string::npos;
    if (moe_layer) continue;
    std::string m = n;
    if (pos != std::string::npos && n.rfind("model.layers.0.", 0) != 0)
      m = n.substr(0, pos) + ".mlp." + n.substr(pos + 18);
    t[m] = ck.load(n);
  }
  for (int64_t i = 1; i < c.num_hidden_layers; ++i) {
    const std::string p = layer_prefix(i) + "block_sparse_moe.experts.";
    std::vector<Tensor> gu, dn;
    for (int64_t j = 0; j < c.num_experts; ++j) {
      const std::string e = p + std::to_string(j) + ".";
      gu.push_back(
          ops::unsqueeze(ops::concat({ck.load(e + "w1.weight"), ck.load(e + "w3.weight")}, 0), 0));
      dn.push_back(ops::unsqueeze(ck.load(e + "w2.weight"), 0));
    }
    t[layer_prefix(i) + "mlp.experts.gate_up_proj"] = ops::concat(gu, 0);
    t[layer_prefix(i) + "mlp.experts.down_proj"] = ops::concat(dn, 0);
  }
  safetensors::save((dir / "model.safetensors").string(), t);
  NoGradGuard ng;
  Decoder a = Decoder::load(src), b = Decoder::load(dir.string());
  const Tensor ids = safetensors::open(src + "/inputs.safetensors").load("input_ids");
  EXPECT_EQ(max_abs_diff(a.forward(ids).logits_BTV, b.forward(ids).logits_BTV), 0.0);
  fs::remove_all(dir);
}

// Activation recomputation: the same loss and the same gradient for every parameter, uncached
// (pre-norm and AttnRes) and with segments carrying the cache (FFN sublayers only).
TEST(K3, RecomputeGivesTheSameGradients) {
  for (int64_t block : {0, 2}) {
    const ModelConfig c = three_layer_config(block);
    const Tensor ids = token_ids(2, 12, c.vocab_size, 5);
    for (bool segmented : {false, true}) {
      std::map<std::string, std::vector<double>> grads[2];
      double loss[2];
      for (int rc = 0; rc < 2; ++rc) {
        Decoder m = random_model(c, DType::F64, 3);
        m.weights().requires_grad_(true);
        ForwardOptions o{.logits = true, .record = false, .recompute = rc == 1};
        Tensor total;
        if (segmented) {
          DecodeCache cache = m.new_cache();
          for (int64_t s = 0; s < 12; s += 6) {
            Tensor x = ops::contiguous(ops::slice(ids, 1, s, s + 6));
            Tensor l = ops::sum(ops::mul(m.forward(x, &cache, o).logits_BTV, 0.1));
            total = total.defined() ? ops::add(total, l) : l;
          }
        } else {
          total = ops::sum(ops::mul(m.forward(ids, nullptr, o).logits_BTV, 0.1));
        }
        loss[rc] = total.item();
        total.backward();
        for (const auto& s : m.weights().specs()) {
          const Tensor g = m.weights().get(s.name).grad();
          if (g.defined()) grads[rc][s.name] = g.to_doubles();
        }
      }
      EXPECT_NEAR(loss[0], loss[1], 1e-12 * std::abs(loss[0]));
      ASSERT_EQ(grads[0].size(), grads[1].size()) << "block " << block;
      for (const auto& [name, g] : grads[0]) {
        const auto& h = grads[1].at(name);
        for (size_t i = 0; i < g.size(); ++i)
          ASSERT_NEAR(g[i], h[i], 1e-10 * (1 + std::abs(g[i]))) << name << " block " << block;
      }
    }
  }
}

}  // namespace
}  // namespace myriad::model
