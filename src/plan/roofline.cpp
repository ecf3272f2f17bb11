#include "plan/roofline.h"

#include <algorithm>

namespace myriad::plan {

namespace {
constexpr double kChunk = 64;  // KDA chunk length C

double mla_flops(const ModelConfig& c, int64_t seq) {  // per token per MLA layer, forward
  // q·k over d_qk and p·v over d_v for each earlier key: 2·H·(d_qk + d_v) per key, (T+1)/2 keys
  // on average under the causal mask.
  return static_cast<double>(c.num_attention_heads) * (c.qk_head_dim() + c.v_head_dim) *
         (static_cast<double>(seq) + 1);
}

double kda_flops(const ModelConfig& c) {  // per token per KDA layer, forward
  const double H = c.linear_attn_config.num_heads, dk = c.linear_attn_config.head_dim;
  return H * (6 * dk * dk + 3 * kChunk * dk + kChunk * kChunk);
}
}  // namespace

FlopCounts forward_flops_per_token(const ModelConfig& c, const ParamCounts& pc, int64_t seq) {
  FlopCounts f;
  f.matmul = 2 * static_cast<double>(pc.matmul_active);
  for (const auto& l : pc.layers)
    (l.mla ? f.attention : f.kda) += l.mla ? mla_flops(c, seq) : kda_flops(c);
  return f;
}

StepEstimate training_step(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                           const TrainSetup& s, CommBreakdown* comm_out) {
  const Layout& l = s.layout;
  const double gemm = s.bf16 ? hw.gemm_flops : hw.gemm_flops_f32;
  const double tokens = static_cast<double>(s.tokens_per_micro());
  const double m = static_cast<double>(s.micro_batches());
  const bool rc = s.recompute == Recompute::Full;
  const double passes = rc ? 4 : 3;         // forward 1, backward 2, recomputed forward 1
  const double attn_passes = passes + 0.5;  // flash backward recomputes the scores
  const int act_bytes = s.bf16 ? 2 : 4;
  // Weight traffic per parameter and micro-batch: read in the forward (and its replay), read
  // again in the backward, and the fp32 gradient read-modify-written.
  const double wbytes = (s.bf16 ? 2 : 4) * (rc ? 3 : 2) + 8;
  auto roof = [&](double flops, double bytes, double rate) {
    return std::max(flops / rate, bytes / hw.mem_bw);
  };

  StepEstimate e;
  e.tokens = static_cast<double>(s.batch * s.seq);
  const FlopCounts f = forward_flops_per_token(c, pc, s.seq);
  e.model_flops_per_token = 3 * f.total();
  e.hw_flops_per_token = passes * f.total();
  const double n = static_cast<double>(c.num_experts), k = c.num_experts_per_token;
  e.expert_tokens = n > 0 ? tokens * k * static_cast<double>(l.ep) / n : 0;

  const auto stages = stage_layers(c.num_hidden_layers, l.pp);
  double opt_flops = 0, opt_params = 0;
  for (int64_t st = 0; st < l.pp; ++st) {
    StageTime t;
    double ns_shared = 0, ns_routed = 0, p_shared = 0, p_routed = 0;
    for (int64_t i = stages[st].first; i < stages[st].second; ++i) {
      const LayerParams& lp = pc.layers[i];
      const double sh = static_cast<double>(lp.shared);
      t.gemm += roof(2 * sh * tokens * passes, sh * wbytes, gemm);
      if (lp.moe) {
        // Each rank computes tokens·k expert slots on average over its n/ep local experts.
        const double local = static_cast<double>(lp.routed) / static_cast<double>(l.ep);
        t.experts += roof(2 * pc.expert_size * tokens * k * passes, local * wbytes, gemm);
      }
      if (lp.mla)
        t.attention += mla_flops(c, s.seq) * tokens * attn_passes / (gemm * hw.attn_eff);
      else
        t.kda += kda_flops(c) * tokens * passes / (gemm * hw.kda_eff);
      // Element-wise work: each kept value is written, read back in the backward, and its
      // gradient written and read; a replay writes it again.
      t.memory += layer_activations(c, i, s.seq).bytes(act_bytes, tokens, s.micro_batch) *
                  (rc ? 5 : 4) / hw.mem_bw;
      ns_shared += lp.muon_ns_flops_shared, ns_routed += lp.muon_ns_flops_routed;
      p_shared += sh, p_routed += static_cast<double>(lp.routed) / static_cast<double>(l.ep);
    }
    if (st == l.pp - 1) {  // LM head and the fused cross-entropy
      const double h = static_cast<double>(pc.head);
      t.gemm += roof(2 * h * tokens * passes, h * wbytes, gemm);
      t.memory += tokens * c.vocab_size * 4 * 3 / hw.mem_bw;
      p_shared += h + pc.model_level_other;
    }
    if (st == 0) p_shared += pc.embedding;
    if (t.total() > e.stage.total()) e.stage = t;
    // With ZeRO each matrix is updated (and orthogonalised by Muon) by one owner among its
    // replicas; without it every replica updates its own copy.
    const double rep_sh = s.zero >= 1 ? static_cast<double>(l.dp * l.cp) : 1;
    const double rep_ro = s.zero >= 1 ? static_cast<double>(l.dp * l.cp) / l.ep : 1;
    if (s.optimizer == Optimizer::Muon)
      opt_flops = std::max(opt_flops, ns_shared / rep_sh + ns_routed / l.ep / rep_ro);
    opt_params = std::max(opt_params, p_shared / rep_sh + p_routed / rep_ro);
  }
  // 1F1B: m micro-batches through pp stages take (m + pp - 1) slots of the slowest stage.
  e.compute = (m + static_cast<double>(l.pp) - 1) * e.stage.total();
  e.bubble = (static_cast<double>(l.pp) - 1) * e.stage.total();
  // The optimiser streams master, gradient, states and weights of its shard once.
  const double state_bytes = s.optimizer == Optimizer::Muon ? 4 : 8;
  e.optimizer = opt_flops / gemm + opt_params * (4 + 4 + 2 * state_bytes + 4 + 2) / hw.mem_bw;

  CommBreakdown comm = training_comm(c, pc, hw, s, e.compute * 2 / passes);
  e.comm_exposed = comm.exposed;
  if (comm_out) *comm_out = comm;
  e.step = e.compute + e.optimizer + e.comm_exposed;
  const double devices = static_cast<double>(l.gpus());
  const double peak = s.bf16 ? hw.peak_flops : hw.peak_flops_f32;
  e.mfu = e.model_flops_per_token * e.tokens / (e.step * devices * peak);
  e.tokens_per_s = e.tokens / e.step;
  e.tokens_per_s_per_device = e.tokens_per_s / devices;
  return e;
}

}  // namespace myriad::plan
