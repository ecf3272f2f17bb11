// The scale planner: parameter counts against the published totals and MODEL.md §9's K3
// breakdown, the tensor list against the §12 options, cache sizes (§3.3, §4.8), ZeRO and
// communication bookkeeping, layout ranking, serving, the JSON form, and predicted training
// memory against the peak measured on the engine's own CPU forward + backward.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>

#include <cmath>
#include <set>

#include "core/allocator.h"
#include "core/error.h"
#include "model/decoder.h"
#include "plan/planner.h"

namespace myriad::plan {
namespace {

constexpr double MiB = 1024.0 * 1024.0, GiB = 1024.0 * MiB;

void expect_near_rel(double got, double want, double rel, const char* what) {
  EXPECT_LE(std::fabs(got - want), rel * want)
      << what << ": got " << got << ", want " << want << " ± " << rel * 100 << "%";
}

int64_t part(const ParamCounts& pc, Part p, bool active = false) {
  return (active ? pc.active_by_part : pc.total_by_part)[static_cast<int>(p)];
}

TEST(PlanParams, KimiK3MatchesPublishedTotals) {
  const ParamCounts pc = count_params(model::kimi_k3());
  expect_near_rel(pc.total, 2.78e12, 0.01, "K3 total");
  expect_near_rel(pc.active, 104.2e9, 0.02, "K3 active");
  // MODEL.md §9: the breakdown derived from the config.
  expect_near_rel(part(pc, Part::RoutedExperts, true), 48.6e9, 0.01, "routed active");
  expect_near_rel(part(pc, Part::SharedExperts), 12.2e9, 0.01, "shared");
  expect_near_rel(part(pc, Part::KdaAttention) + part(pc, Part::MlaAttention), 36.2e9, 0.01,
                  "attention");
  expect_near_rel(part(pc, Part::LatentProj), 4.7e9, 0.01, "latent projections");
  expect_near_rel(part(pc, Part::Embedding) + part(pc, Part::Head), 2.3e9, 0.03, "emb + head");
  expect_near_rel(part(pc, Part::Router) + part(pc, Part::DenseFfn), 1.3e9, 0.02, "router + dense");
  expect_near_rel(part(pc, Part::RoutedExperts), 2.72e12, 0.005, "routed total");
  // 896 experts of 3 × 3072 × 3584, 16 active, in 92 MoE layers.
  EXPECT_EQ(pc.expert_size, 3 * 3072 * 3584);
  EXPECT_EQ(part(pc, Part::RoutedExperts), 896LL * pc.expert_size * 92);
  EXPECT_EQ(part(pc, Part::RoutedExperts, true), 16LL * pc.expert_size * 92);
  // Active = everything but the non-routed experts' unused share and the embedding lookup.
  EXPECT_EQ(pc.active_with_embedding - pc.active, part(pc, Part::Embedding));
  EXPECT_EQ(pc.total - pc.active_with_embedding,
            part(pc, Part::RoutedExperts) - part(pc, Part::RoutedExperts, true));
}

TEST(PlanParams, KimiLinearAndDeepSeekMatchPublishedTotals) {
  const ParamCounts kl = count_params(model::kimi_linear_48b());
  EXPECT_GE(kl.total, 48e9);
  EXPECT_LE(kl.total, 49.5e9);  // 49.12B counted: "48B" in the name
  expect_near_rel(kl.active, 3e9, 0.05, "Kimi Linear active");
  const ParamCounts ds = count_params(model::deepseek_v3());
  expect_near_rel(ds.total, 671e9, 0.015, "DeepSeek-V3 total");
  expect_near_rel(ds.active, 37e9, 0.015, "DeepSeek-V3 active");
  EXPECT_EQ(ds.mtp_layers_not_built, 1);
  // Myriad's own sizes (MODEL.md §1, ANCHORS.md §3: medium is 688M with ≈153M active).
  expect_near_rel(count_params(model::tiny()).total, 1.6e6, 0.02, "tiny");
  const ParamCounts med = count_params(model::medium());
  expect_near_rel(med.total, 688e6, 0.002, "medium");
  expect_near_rel(med.active, 153e6, 0.01, "medium active");
}

TEST(PlanParams, TensorListIsTheCount) {
  for (const auto& name : model::preset_names()) {
    const model::ModelConfig c = model::preset(name);
    const auto tensors = expected_tensors(c);
    const ParamCounts pc = count_params(c);
    int64_t sum = 0;
    std::set<std::string> names;
    for (const auto& [n, shape] : tensors) {
      sum += shape_numel(shape);
      EXPECT_TRUE(names.insert(n).second) << name << ": duplicate " << n;
      EXPECT_TRUE(n.rfind("model.", 0) == 0 || n == "lm_head.weight") << n;
    }
    EXPECT_EQ(sum, pc.total) << name;
    EXPECT_EQ(static_cast<int64_t>(tensors.size()), pc.num_tensors) << name;
    int64_t per_layer = pc.embedding + pc.head + pc.model_level_other;
    for (const auto& l : pc.layers) per_layer += l.shared + l.routed;
    EXPECT_EQ(per_layer, pc.total) << name;
    // Only the balancer's biases (one per expert and MoE layer) are not trained.
    int64_t moe_layers = 0;
    for (const auto& l : pc.layers) moe_layers += l.moe;
    EXPECT_EQ(pc.total - pc.trainable, moe_layers * c.num_experts) << name;
    EXPECT_LT(pc.muon, pc.trainable);
  }
}

TEST(PlanParams, NamesAndShapesFollowTheSpec) {
  const model::ModelConfig c = model::tiny();  // K3 form: latent MoE, AttnRes, full-rank gate
  std::map<std::string, Shape> t;
  for (auto& [n, s] : expected_tensors(c)) t[n] = s;
  const int64_t d = 128, P = 64;
  EXPECT_EQ(t.at("model.embed_tokens.weight"), (Shape{512, d}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.q_conv1d.weight"), (Shape{P, 1, 4}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.A_log"), (Shape{1, 1, 2, 1}));
  EXPECT_EQ(t.at("model.layers.0.self_attn.g_proj.weight"), (Shape{P, d}));
  EXPECT_EQ(t.at("model.layers.0.mlp.gate_proj.weight"), (Shape{256, d}));
  EXPECT_EQ(t.at("model.layers.3.self_attn.q_b_proj.weight"), (Shape{2 * 48, 64}));
  EXPECT_EQ(t.at("model.layers.3.self_attn.kv_a_proj_with_mqa.weight"), (Shape{64 + 16, d}));
  EXPECT_EQ(t.at("model.layers.3.self_attn.kv_b_proj.weight"), (Shape{2 * 64, 64}));
  EXPECT_EQ(t.at("model.layers.1.block_sparse_moe.experts.7.w2.weight"), (Shape{64, 64}));
  EXPECT_EQ(t.at("model.layers.1.block_sparse_moe.routed_expert_up_proj.weight"), (Shape{d, 64}));
  EXPECT_EQ(t.at("model.layers.1.mlp_res_proj.weight"), (Shape{1, d}));
  EXPECT_EQ(t.at("model.output_attn_res_norm.weight"), (Shape{d}));
  EXPECT_EQ(t.count("model.layers.3.self_attn.g_proj.weight"), 0u);  // tiny MLA has no gate
  // DeepSeek-V3 spelling of the MoE (§11.2).
  std::set<std::string> ds;
  for (auto& [n, s] : expected_tensors(model::deepseek_v3())) ds.insert(n);
  EXPECT_TRUE(ds.count("model.layers.3.mlp.experts.255.down_proj.weight"));
  EXPECT_TRUE(ds.count("model.layers.3.mlp.gate.e_score_correction_bias"));
  EXPECT_TRUE(ds.count("model.layers.2.mlp.down_proj.weight"));
  EXPECT_FALSE(ds.count("model.layers.2.mlp.gate.weight"));
}

TEST(PlanParams, MyriadOptionsAddTheirTensors) {
  const model::ModelConfig base = model::tiny();
  const ParamCounts b = count_params(base);
  const int64_t d = base.hidden_size, L = base.num_hidden_layers, n = base.num_experts;
  const int64_t mla = base.num_mla_layers(), moe = L - 1;
  auto delta = [&](model::ModelConfig c) { return count_params(c).total - b.total; };

  model::ModelConfig c = base;
  c.myriad.router.mode = "latent_similarity";  // §12.2: replaces gate.weight
  EXPECT_EQ(delta(c), moe * (64 * d + n * 64 - n * d));
  std::set<std::string> names;
  for (auto& [nm, s] : expected_tensors(c)) names.insert(nm);
  EXPECT_TRUE(names.count("model.layers.1.block_sparse_moe.gate.latent_proj.weight"));
  EXPECT_TRUE(names.count("model.layers.1.block_sparse_moe.gate.expert_embed"));
  EXPECT_FALSE(names.count("model.layers.1.block_sparse_moe.gate.weight"));

  c = base;
  c.myriad.admission.enabled = true;  // §12.4: w1 [h_a, d + r_kv], w2 [1, h_a], biases
  const int64_t ha = c.myriad.admission.hidden, r = c.kv_lora_rank;
  EXPECT_EQ(delta(c), mla * (ha * (d + r) + ha + ha + 1));

  for (auto [mode, per] : {std::pair{"gamma_scalar", int64_t{1}}, std::pair{"gamma_vector", d},
                           std::pair{"gamma_input", 2 * d + 1}}) {
    c = base;
    c.myriad.residual.attn_carry = mode;  // §12.1: layers 1..L-1, each with attn_carry.gamma
    EXPECT_EQ(delta(c), (L - 1) * per) << mode;
  }
  std::map<std::string, Shape> t;
  for (auto& [nm, s] : expected_tensors(c)) t[nm] = s;  // gamma_input: γ's bias, w, norm
  EXPECT_EQ(t.at("model.layers.1.attn_carry.gamma"), (Shape{1}));
  EXPECT_EQ(t.at("model.layers.7.attn_carry.w"), (Shape{d}));
  EXPECT_EQ(t.at("model.layers.7.attn_carry.norm.weight"), (Shape{d}));
  EXPECT_EQ(t.count("model.layers.0.attn_carry.gamma"), 0u);
}

TEST(PlanCaches, MatchModelMd) {
  const CacheFootprint k3 = cache_footprint(model::kimi_k3());
  EXPECT_EQ(k3.mla_layers, 24);
  EXPECT_EQ(k3.mla_bytes_per_token, 27648);                        // §3.3
  EXPECT_EQ(k3.kda_state_bytes, static_cast<int64_t>(207 * MiB));  // §4.8: 69 × 3 MiB
  EXPECT_EQ(k3.kda_conv_bytes, 69 * 216 * 1024);                   // 216 KiB per layer
  EXPECT_DOUBLE_EQ(k3.per_sequence(1 << 20) - k3.kda_state_bytes - k3.kda_conv_bytes,
                   27 * GiB);  // 27 GiB of latents at 1M tokens
  EXPECT_EQ(cache_footprint(model::kimi_linear_48b()).mla_bytes_per_token, 8064);
  EXPECT_EQ(cache_footprint(model::kimi_linear_48b()).kda_state_bytes,
            static_cast<int64_t>(20 * MiB));
  EXPECT_EQ(cache_footprint(model::deepseek_v3()).mla_bytes_per_token, 70272);
  EXPECT_EQ(cache_footprint(model::deepseek_v3()).kda_state_bytes, 0);
  // Admission gate: the window plus the admitted share of older keys.
  model::ModelConfig c = model::kimi_k3();
  c.myriad.admission.enabled = true;
  const CacheFootprint a = cache_footprint(c);
  EXPECT_DOUBLE_EQ(a.mla_tokens(1000), 1000);
  EXPECT_DOUBLE_EQ(a.mla_tokens(4096 + 4000), 4096 + 0.25 * 4000);
}

TrainSetup setup(Layout l, int64_t seq, int64_t batch) {
  TrainSetup s;
  s.layout = l;
  s.seq = seq;
  s.batch = batch;
  return s;
}

TEST(PlanMemory, ZeroShardsAddUpToTheWholeModel) {
  const model::ModelConfig c = model::medium();
  const ParamCounts pc = count_params(c);
  const Hardware& hw = hardware("h200");
  const TrainSetup s = setup({4, 2, 1, 1}, 1024, 4);
  const MemoryBreakdown m = training_memory(c, pc, hw, s);
  int64_t routed = 0;
  for (const auto& l : pc.layers) routed += l.routed;
  const double total = static_cast<double>(pc.total);
  // Weights and gradients: all non-expert weights and half the experts on each device.
  EXPECT_DOUBLE_EQ(m.params_local, total - routed / 2.0);
  EXPECT_DOUBLE_EQ(m.weights, 2 * m.params_local);
  EXPECT_DOUBLE_EQ(m.grads, 4 * m.params_local);
  // Master and optimiser states: the four devices hold exactly one copy between them.
  EXPECT_NEAR(4 * m.master, 4 * total, 1e-6 * total);
  EXPECT_NEAR(4 * m.optimizer, 4.0 * pc.muon + 8.0 * (total - pc.muon), 1e-6 * total);
  TrainSetup adam = s;
  adam.optimizer = Optimizer::AdamW;
  EXPECT_NEAR(4 * training_memory(c, pc, hw, adam).optimizer, 8 * total, 1e-6 * total);
  TrainSetup z3 = s;
  z3.zero = 3;
  EXPECT_NEAR(4 * training_memory(c, pc, hw, z3).weights, 2 * total, 1e-6 * total);
}

TEST(PlanMemory, ActivationsFollowTokensRecomputeAndPipeline) {
  const model::ModelConfig c = model::medium_k3();
  const ParamCounts pc = count_params(c);
  const Hardware& hw = hardware("h200");
  const MemoryBreakdown a = training_memory(c, pc, hw, setup({1, 1, 1, 1}, 4096, 8));
  TrainSetup s2 = setup({1, 1, 1, 1}, 4096, 8);
  s2.micro_batch = 2;
  const MemoryBreakdown b = training_memory(c, pc, hw, s2);
  // Twice the tokens per micro-batch: twice the per-token part (the head's dW is fixed).
  const double fixed = 4.0 * c.vocab_size * c.hidden_size;
  EXPECT_NEAR(b.activations_none - fixed, 2 * (a.activations_none - fixed),
              1e-6 * a.activations_none);
  EXPECT_LT(a.activations_full, a.activations_none / 5);
  TrainSetup rc = setup({1, 1, 1, 1}, 4096, 8);
  rc.recompute = Recompute::Full;
  EXPECT_DOUBLE_EQ(training_memory(c, pc, hw, rc).activations, a.activations_full);
  // 1F1B: stage 0 of 4 keeps 4 micro-batches in flight, so its activations are ~4 stages' worth
  // of one micro-batch through a quarter of the layers.
  const MemoryBreakdown p4 = training_memory(c, pc, hw, setup({1, 1, 4, 1}, 4096, 8));
  EXPECT_GT(p4.activations_none, 0.8 * (a.activations_none - fixed));
  EXPECT_LT(p4.params_local, a.params_local / 2);
  EXPECT_THROW(training_memory(c, pc, hw, setup({2, 3, 1, 1}, 4096, 8)), Error);  // ep ∤ dp·cp
  EXPECT_THROW(training_memory(c, pc, hw, setup({3, 1, 1, 1}, 4096, 8)), Error);  // batch % dp
  EXPECT_THROW(training_memory(c, pc, hw, setup({1, 1, 1, 3}, 4096, 8)), Error);  // seq % cp
}

// The engine's own forward + backward on the CPU (f32), second step so the gradients exist:
// the allocator's peak against weights + gradients + activations + workspace as predicted.
// Nothing else in this test program allocates tensors, so the peak is this run's.
TEST(PlanMemory, PredictsMeasuredCpuPeakWithin15Percent) {
  const model::ModelConfig c = model::tiny();
  const int64_t B = 2, T = 128;
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);  // spinning OpenMP threads on a busy 2-core machine take seconds
  model::Decoder m = model::Decoder::random(c, 1);
  m.weights().requires_grad_(true);
  std::vector<int64_t> ids(B * T);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i * 7919 % c.vocab_size);
  const Tensor tokens = Tensor::from_ints(ids, {B, T}, DType::I64);
  for (int step = 0; step < 2; ++step) m.loss(tokens).backward();
  const double measured = static_cast<double>(allocator_for(DeviceType::CPU).stats().peak);
  omp_set_num_threads(threads);

  TrainSetup s = setup({1, 1, 1, 1}, T, B);
  s.micro_batch = B;
  s.bf16 = false;
  s.zero = 0;
  const MemoryBreakdown p = training_memory(c, count_params(c), hardware("zen5"), s);
  const double predicted = p.weights + p.grads + p.activations + p.workspace;  // no optimiser ran
  std::printf("tiny B%lld T%lld: predicted %.2f MB, measured peak %.2f MB\n", (long long)B,
              (long long)T, predicted / 1e6, measured / 1e6);
  EXPECT_NEAR(predicted, measured, 0.15 * measured)
      << "predicted " << predicted << " B, measured peak " << measured << " B";
}

TEST(PlanComm, VolumesFollowTheLayout) {
  const model::ModelConfig k3 = model::kimi_k3();
  const ParamCounts pc = count_params(k3);
  const Hardware& hw = hardware("h200");
  auto items = [&](TrainSetup s) {
    std::map<std::string, CommItem> out;
    for (auto& it : training_comm(k3, pc, hw, s, 0).items) out[it.name] = it;
    return out;
  };
  // Nothing to exchange on one device.
  EXPECT_TRUE(items(setup({1, 1, 1, 1}, 4096, 1)).empty());
  // Data parallel over 8: (g-1)/g of the fp32 gradients and bf16 weights (no experts sharded).
  auto dp8 = items(setup({8, 1, 1, 1}, 4096, 8));
  // Balancer-set biases have no gradient: neither reduced nor gathered.
  double shared = pc.embedding + pc.head + pc.model_level_other, routed = 0;
  for (const auto& l : pc.layers) shared += l.shared - l.frozen, routed += l.routed;
  EXPECT_NEAR(dp8.at("dp_reduce_scatter").bytes, 7.0 / 8 * 4 * shared, 1e-9 * shared);
  EXPECT_NEAR(dp8.at("expert_all_gather").bytes, 7.0 / 8 * 2 * routed, 1e-9 * routed);
  EXPECT_FALSE(dp8.at("dp_reduce_scatter").network);
  EXPECT_EQ(dp8.count("ep_dispatch"), 0u);
  // QB: 896 experts × 1000 bins × int32 = 3.584 MB per MoE layer (TRAINING.md §3.2), plus the
  // 896 expert counts and the token count, 92 layers.
  EXPECT_NEAR(dp8.at("balancer_all_reduce").bytes, 2 * 7.0 / 8 * (3.584e6 + 897 * 4) * 92, 1.0);
  // Expert parallel over 8 within the 8 data-parallel ranks: 7/8 of k latent rows per token,
  // fp8 out and bf16 back in the forward, bf16 both ways in the backward.
  auto ep8 = items(setup({8, 8, 1, 1}, 4096, 8));
  const double rows = 7.0 / 8 * 4096 * 16 * 3584 * 92;
  EXPECT_NEAR(ep8.at("ep_dispatch").bytes, rows * (1 + 4.0 / 128 + 2), 1e-9 * rows);
  EXPECT_NEAR(ep8.at("ep_combine").bytes, rows * 4, 1e-9 * rows);
  EXPECT_FALSE(ep8.at("ep_dispatch").network);
  EXPECT_TRUE(items(setup({16, 16, 1, 1}, 4096, 16)).at("ep_dispatch").network);
  // Context parallel brings the KDA scan and the MLA latent gather; pipelines their hand-off.
  auto cp = items(setup({1, 1, 2, 4}, 4096, 4));
  EXPECT_GT(cp.at("cp_kda_scan").bytes, 0);
  EXPECT_GT(cp.at("cp_mla_latents").bytes, 0);
  EXPECT_GT(cp.at("pp_send_recv").bytes, 0);
  EXPECT_EQ(cp.at("cp_kda_scan").group, 4);
}

TEST(PlanComm, LinkTimes) {
  const Hardware& hw = hardware("h200");
  EXPECT_DOUBLE_EQ(ring_seconds(hw, 1e9, 8, 1), 1e9 / hw.link_bw);
  EXPECT_DOUBLE_EQ(ring_seconds(hw, 1e9, 8, 2), 1e9 / hw.net_bw);
  EXPECT_DOUBLE_EQ(ring_seconds(hw, 1e9, 1, 1), 0);
  EXPECT_DOUBLE_EQ(all_to_all_seconds(hw, 1e9, 8), 1e9 / hw.a2a_link_bw);
  // 64 ranks: 7 of 63 peers share the node; the network share dominates.
  EXPECT_DOUBLE_EQ(all_to_all_seconds(hw, 1e9, 64), 1e9 * 56 / 63 / hw.a2a_net_bw);
}

TEST(PlanRoofline, FlopsAndEstimates) {
  const model::ModelConfig c = model::kimi_k3();
  const ParamCounts pc = count_params(c);
  const FlopCounts f = forward_flops_per_token(c, pc, 8192);
  EXPECT_DOUBLE_EQ(f.matmul, 2.0 * pc.matmul_active);
  expect_near_rel(pc.matmul_active, pc.active, 0.001, "matrix share of active");
  // 24 MLA layers × 96 heads × (192 + 128) × (T + 1); 69 KDA layers × 96 × (6·128² + 3·64·128
  // + 64²).
  EXPECT_DOUBLE_EQ(f.attention, 24.0 * 96 * 320 * 8193);
  EXPECT_DOUBLE_EQ(f.kda, 69.0 * 96 * (6 * 128 * 128 + 3 * 64 * 128 + 64 * 64));
  const Hardware& hw = hardware("h200");
  TrainSetup s = setup({32, 32, 8, 8}, 8192, 2048);
  s.recompute = Recompute::Full;
  const StepEstimate e = training_step(c, pc, hw, s);
  EXPECT_GT(e.step, e.compute);
  EXPECT_DOUBLE_EQ(e.tokens, 2048.0 * 8192);
  EXPECT_DOUBLE_EQ(e.model_flops_per_token, 3 * f.total());
  EXPECT_DOUBLE_EQ(e.hw_flops_per_token, 4 * f.total());
  EXPECT_GT(e.mfu, 0.05);
  EXPECT_LT(e.mfu, hw.gemm_flops / hw.peak_flops);
  EXPECT_NEAR(e.tokens_per_s_per_device * 2048 * e.step, e.tokens, 1e-6 * e.tokens);
  // 1F1B with 8 stages and 64 micro-batches: the bubble is 7 of 71 slots.
  EXPECT_NEAR(e.bubble / e.compute, 7.0 / 71, 1e-12);
}

TEST(Planner, RanksFittingLayouts) {
  const model::ModelConfig c = model::medium();
  PlanRequest r;
  r.gpus = 16;
  r.seq = 8192;
  r.batch = 64;
  const Plan p = make_plan(c, r);
  ASSERT_FALSE(p.ranked.empty());
  EXPECT_LE(static_cast<int>(p.ranked.size()), r.top);
  EXPECT_GE(p.considered, p.feasible);
  for (size_t i = 0; i < p.ranked.size(); ++i) {
    const auto& lp = p.ranked[i];
    EXPECT_EQ(lp.setup.layout.gpus(), 16);
    EXPECT_TRUE(lp.memory.fits());
    if (i > 0) {
      EXPECT_LE(p.ranked[i - 1].step.step, lp.step.step);
    }
  }
  // Fixed degrees are honoured.
  r.pp = 2, r.ep = 4;
  for (const auto& lp : make_plan(c, r).ranked) {
    EXPECT_EQ(lp.setup.layout.pp, 2);
    EXPECT_EQ(lp.setup.layout.ep, 4);
  }
  r.dp = 3;  // 3 × 2 × cp cannot make 16
  EXPECT_THROW(make_plan(c, r), Error);
}

TEST(Planner, KimiK3NeedsAClusterAndFitsOnOne) {
  const model::ModelConfig c = model::kimi_k3();
  PlanRequest r;
  r.gpus = 8;
  r.seq = 8192;
  const Plan small = make_plan(c, r);
  EXPECT_TRUE(small.ranked.empty());
  ASSERT_TRUE(small.smallest_miss.has_value());
  EXPECT_GT(small.smallest_miss->memory.total, small.smallest_miss->memory.capacity);
  r.gpus = 2048;
  r.batch = 2048;
  r.top = 3;
  const Plan big = make_plan(c, r);
  ASSERT_FALSE(big.ranked.empty());
  const LayoutPlan& best = big.ranked.front();
  EXPECT_LE(best.memory.total, 140 * GiB * 0.9);
  EXPECT_GT(best.step.mfu, 0.1);
  EXPECT_GT(best.setup.layout.ep, 1);
  // The JSON form carries the same numbers and parses back.
  const nlohmann::json j = nlohmann::json::parse(plan_json(big).dump());
  EXPECT_EQ(j["params"]["total"].get<int64_t>(), big.params.total);
  EXPECT_EQ(j["layouts"].size(), big.ranked.size());
  EXPECT_DOUBLE_EQ(j["layouts"][0]["step"]["step"].get<double>(), best.step.step);
  EXPECT_EQ(j["serving"]["context"].get<int64_t>(), 1 << 20);
  const std::string text = format_plan(big);
  EXPECT_NE(text.find("Layouts ranked"), std::string::npos);
  EXPECT_NE(text.find("ep_dispatch"), std::string::npos);
}

TEST(Planner, ServingAtOneMillionTokens) {
  const model::ModelConfig c = model::kimi_k3();
  const ParamCounts pc = count_params(c);
  const Hardware& hw = hardware("h200");
  const ServePlan bf = serving_plan(c, pc, hw, 1 << 20, 8, "bf16");
  EXPECT_DOUBLE_EQ(bf.weight_bytes, 2.0 * pc.total);
  EXPECT_DOUBLE_EQ(bf.cache_per_seq, 27 * GiB + 207 * MiB + 69 * 216 * 1024.0);
  EXPECT_DOUBLE_EQ(bf.cache_all_mla_per_seq, 93 * 1152.0 * (1 << 20));
  EXPECT_EQ(bf.asked.devices_min,
            static_cast<int64_t>(
                std::ceil((bf.weight_bytes + 8 * bf.cache_per_seq) / (hw.mem_bytes * hw.usable))));
  EXPECT_GE(bf.asked.devices, bf.asked.devices_min);
  EXPECT_EQ(bf.asked.devices % 8, 0);
  // MXFP4 experts (4.25 bits) cut the weights and the devices.
  const ServePlan fp4 = serving_plan(c, pc, hw, 1 << 20, 8, "mxfp4");
  const double routed = static_cast<double>(part(pc, Part::RoutedExperts));
  EXPECT_DOUBLE_EQ(bf.weight_bytes - fp4.weight_bytes, routed * (2 - 4.25 / 8));
  EXPECT_LT(fp4.asked.devices, bf.asked.devices);
  // More sequences never need fewer devices and never decode fewer tokens per second.
  for (size_t i = 1; i < bf.sweep.size(); ++i) {
    EXPECT_GE(bf.sweep[i].devices_min, bf.sweep[i - 1].devices_min);
    EXPECT_GT(bf.sweep[i].decode_tokens_per_s, bf.sweep[i - 1].decode_tokens_per_s);
  }
  EXPECT_THROW(serving_plan(c, pc, hw, 1 << 20, 1, "int3"), Error);
}

}  // namespace
}  // namespace myriad::plan
