#include "plan/memory.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace myriad::plan {

std::string Layout::str() const {
  return cat("dp", dp, " ep", ep, " pp", pp, " cp", cp);
}

std::string TrainSetup::invalid_reason(const ModelConfig& c) const {
  const Layout& l = layout;
  if (l.dp < 1 || l.ep < 1 || l.pp < 1 || l.cp < 1) return "every parallel degree must be >= 1";
  if (seq < 1 || batch < 1 || micro_batch < 1) return "seq, batch and micro-batch must be >= 1";
  if ((l.dp * l.cp) % l.ep != 0) return cat("ep ", l.ep, " does not divide dp*cp ", l.dp * l.cp);
  if (c.num_experts == 0 ? l.ep != 1 : c.num_experts % l.ep != 0)
    return cat("ep ", l.ep, " does not divide the ", c.num_experts, " experts");
  if (l.pp > c.num_hidden_layers)
    return cat("pp ", l.pp, " exceeds ", c.num_hidden_layers, " layers");
  if (seq % l.cp != 0) return cat("cp ", l.cp, " does not divide seq ", seq);
  if (batch % (l.dp * micro_batch) != 0)
    return cat("batch ", batch, " is not a multiple of dp*micro_batch ", l.dp * micro_batch);
  if (zero < 0 || zero > 3) return cat("zero stage ", zero, " outside 0..3");
  return "";
}

// ---- Activations kept for backward ----
// Counted op by op from the model code as composed in src/model/ (which the GPU backend runs
// unchanged): every output some backward closure saves, including the contiguous copies that
// reshapes of split views make. Values are per token unless named otherwise.
LayerActivations layer_activations(const ModelConfig& c, int64_t i, int64_t tokens_per_seq) {
  LayerActivations a;
  const double d = static_cast<double>(c.hidden_size);
  // Residual stream: both norms' inputs and outputs, plus the sublayer outputs the residual
  // adds keep (binary ops capture their operands); Block AttnRes adds its partial sums and mix
  // outputs (§7). Each RMSNorm keeps an f32 rstd. The totals, 5d and 6.5d, are as measured on
  // the engine (tiny, all-MLA / all-KDA / dense / MoE variants).
  a.act += c.uses_attn_res() ? 6.5 * d : 5 * d;
  a.f32 += 2;
  const auto& carry = c.myriad.residual.attn_carry;  // §12.1: the carried Â and its gate
  if (i > 0 && (carry == "gamma_scalar" || carry == "gamma_vector")) a.act += d;
  if (i > 0 && carry == "gamma_input") a.act += 3 * d, a.f32 += 2;

  if (c.is_mla_layer(i)) {
    const double H = static_cast<double>(c.num_attention_heads), dqk = c.qk_head_dim(),
                 dv = c.v_head_dim, dr = c.qk_rope_head_dim, r = c.kv_lora_rank;
    if (c.q_lora_rank) a.act += 2 * static_cast<double>(*c.q_lora_rank), a.f32 += 1;  // q_a, norm
    a.act += H * dqk;                                                                 // q
    a.act += r + dr;                                                                  // [c ; k_pe]
    a.act += 2 * r, a.f32 += 1;                      // contiguous c, its norm
    a.act += H * (dqk - dr + dv);                    // kv_b output (k_nope, v)
    a.act += H * dqk + dr;                           // k = [k_nope ; k_pe]
    a.act += 2 * H * dv;                             // attention output and its [T, H·dv] copy
    a.f32 += H;                                      // logsumexp
    if (c.mla_use_output_gate) a.act += 3 * H * dv;  // g_proj, sigmoid, product
    if (c.myriad.admission.enabled) a.act += 2 * c.myriad.admission.hidden + 2, a.f32 += 1;
  } else {
    const auto& lac = c.linear_attn_config;
    const double H = lac.num_heads, dk = lac.head_dim, P = H * dk;
    a.act += 9 * P;   // [q̂;k̂;v̂], conv output, SiLU output
    a.act += 7 * P;   // q, k: contiguous copy, L2 norm's kept input and output; v: copy
    a.act += dk + P;  // f_a output, z
    if (!lac.use_full_rank_gate) a.act += dk;  // g_a output
    a.act += 5 * P;          // KDA output, gate projection, RMSNorm output, sigmoid, gated product
    a.f32 += 4 * P + 3 * H;  // the gate's f32 intermediates and g, β, RMSNorm rstd
    // Chunk-boundary states [H, d_k, d_v] per 64-token chunk, and the final state.
    const double chunks = std::ceil(static_cast<double>(tokens_per_seq) / 64.0);
    a.f32 += chunks * H * dk * dk / static_cast<double>(tokens_per_seq);
    a.f32 += P;  // the chunk solve's rows U [H, d_v] (the CPU kernel keeps them; CUDA does not)
    a.f32_per_sequence += H * dk * dk;
  }

  if (c.is_moe_layer(i)) {
    const double n = c.num_experts, k = c.num_experts_per_token, I = c.moe_intermediate_size,
                 l = static_cast<double>(c.routed_expert_hidden_size.value_or(c.hidden_size));
    a.f32 += 2 * n + 4 * k + 3;  // router logits and scores (f32), gathered/renormalised p
    // Per routed slot: the gathered input, gate, up, GLU output, the expert output and its
    // weighted copy (measured on the engine: 4ℓ + 3I per slot).
    a.act += k * (4 * l + 3 * I);
    // Latent path: z = W↓ x, the combined sum and its RMSNorm output.
    if (c.uses_latent_moe()) a.act += c.latent_moe_use_norm ? 3 * l : 2 * l, a.f32 += 1;
    a.act += 3 * static_cast<double>(c.num_shared_experts * c.moe_intermediate_size);
  } else {
    a.act += 3 * static_cast<double>(c.intermediate_size);  // gate, up, GLU output
  }
  return a;
}

LayerActivations head_activations(const ModelConfig& c) {
  LayerActivations a;
  const double d = static_cast<double>(c.hidden_size);
  a.act += 2 * d;  // final norm input and output
  if (c.uses_attn_res()) a.act += d;
  a.act += d;  // dh, computed by the fused cross-entropy during the forward
  a.f32 += 2;  // rstd, per-row loss
  a.f32_per_micro += static_cast<double>(c.vocab_size) * d;  // dW of the head, f32
  return a;
}

std::vector<std::pair<int64_t, int64_t>> stage_layers(int64_t L, int64_t pp) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t begin = 0;
  for (int64_t s = 0; s < pp; ++s) {
    const int64_t n = L / pp + (s >= pp - L % pp ? 1 : 0);
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

MemoryBreakdown training_memory(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                                const TrainSetup& s) {
  const std::string why = s.invalid_reason(c);
  MYRIAD_CHECK(why.empty(), "plan: ", why);
  const Layout& l = s.layout;
  const double rep_shared = static_cast<double>(l.dp * l.cp);
  const double rep_routed = rep_shared / static_cast<double>(l.ep);
  const int act_bytes = s.bf16 ? 2 : 4;
  const double tokens = static_cast<double>(s.tokens_per_micro());
  const double seqs = static_cast<double>(s.micro_batch);
  const int64_t m = s.micro_batches();
  const auto stages = stage_layers(c.num_hidden_layers, l.pp);
  const LayerActivations head = head_activations(c);

  MemoryBreakdown best;
  for (int64_t st = 0; st < l.pp; ++st) {
    MemoryBreakdown mb;
    mb.stage = st;
    // Parameters on this device, split by replication group and optimiser.
    double shared = 0, routed = 0, muon_shared = 0, muon_routed = 0;
    double keep_none = 0, keep_full = 0, largest_layer = 0;
    for (int64_t i = stages[st].first; i < stages[st].second; ++i) {
      const LayerParams& lp = pc.layers[i];
      shared += lp.shared, muon_shared += lp.muon_shared;
      routed += lp.routed / static_cast<double>(l.ep);
      muon_routed += lp.muon_routed / static_cast<double>(l.ep);
      const double full = layer_activations(c, i, s.seq).bytes(act_bytes, tokens, seqs);
      keep_none += full;
      keep_full += tokens * c.hidden_size * act_bytes;  // the layer input only
      largest_layer = std::max(largest_layer, full);
    }
    if (st == 0) shared += pc.embedding;
    if (st == l.pp - 1) {
      shared += pc.head + pc.model_level_other;
      const double h = head.bytes(act_bytes, tokens, seqs);
      keep_none += h, keep_full += h;
    }
    mb.params_local = shared + routed;
    // Replicas of each weight hold a 1/replicas share of the sharded states.
    auto sharded = [&](double bytes_shared, double bytes_routed, bool shard) {
      return shard ? bytes_shared / rep_shared + bytes_routed / rep_routed
                   : bytes_shared + bytes_routed;
    };
    const double wb = s.bf16 ? 2 : 4;
    mb.weights = sharded(wb * shared, wb * routed, s.zero >= 3);
    mb.grads = sharded(4 * shared, 4 * routed, s.zero >= 2);  // fp32 gradient accumulation
    mb.master = s.bf16 ? sharded(4 * shared, 4 * routed, s.zero >= 1) : 0;
    const bool muon = s.optimizer == Optimizer::Muon;
    // Muon keeps one momentum for its matrices, AdamW two moments for everything else.
    const double opt_shared = muon ? 4 * muon_shared + 8 * (shared - muon_shared) : 8 * shared;
    const double opt_routed = muon ? 4 * muon_routed + 8 * (routed - muon_routed) : 8 * routed;
    mb.optimizer = sharded(opt_shared, opt_routed, s.zero >= 1);

    // 1F1B keeps pp - stage micro-batches in flight on a stage (at most all of them).
    const double in_flight = static_cast<double>(std::min<int64_t>(l.pp - st, m));
    mb.activations_none = in_flight * keep_none;
    // Full recomputation keeps layer inputs and rebuilds one layer's tape at a time.
    mb.activations_full = in_flight * keep_full + largest_layer;
    mb.activations = s.recompute == Recompute::Full ? mb.activations_full : mb.activations_none;

    // Workspace: EP send/receive buffers (k latent rows per token, both ways) and the fused
    // cross-entropy's logits chunk (1024 rows, f32 logits and their gradient).
    const double lat = static_cast<double>(c.routed_expert_hidden_size.value_or(c.hidden_size));
    if (l.ep > 1 && c.num_experts > 0)
      mb.workspace += 2 * tokens * c.num_experts_per_token * lat * act_bytes;
    if (st == l.pp - 1) mb.workspace += 2 * std::min(1024.0, tokens) * c.vocab_size * 4;

    // On the CPU the engine's zero_grad frees the gradients and backward allocates them as the
    // tape is released: with one micro-batch per step they never coexist with the full tape, so
    // the peak (measured: at the end of the forward) holds the larger of the two. GPU plans keep
    // them in persistent (bucketed, reduce-scattered) buffers and count both.
    const double transient = mb.activations + mb.workspace;
    const double live = hw.cpu && m == 1 ? std::max(mb.grads, transient) : mb.grads + transient;
    mb.total = mb.weights + mb.master + mb.optimizer + live;
    mb.capacity = hw.mem_bytes * hw.usable;
    if (st == 0 || mb.total > best.total) best = mb;
  }
  return best;
}

}  // namespace myriad::plan
