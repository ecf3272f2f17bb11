#include "plan/comm.h"

#include <algorithm>
#include <cmath>

namespace myriad::plan {

namespace {
bool crosses(const Hardware& hw, int64_t g, int64_t stride) {
  return g > 1 && g * stride > hw.node_size;
}
}  // namespace

double ring_seconds(const Hardware& hw, double bytes, int64_t g, int64_t stride) {
  if (g <= 1) return 0;
  return bytes / (crosses(hw, g, stride) ? hw.net_bw : hw.link_bw);
}

double all_to_all_seconds(const Hardware& hw, double bytes, int64_t g) {
  if (g <= 1) return 0;
  // Peers inside the node take the NVLink share; the rest leaves through the NIC. Both run
  // at once, so the slower one sets the time.
  const double local = static_cast<double>(std::min<int64_t>(g, hw.node_size) - 1);
  const double share_local = local / static_cast<double>(g - 1);
  return std::max(bytes * share_local / hw.a2a_link_bw, bytes * (1 - share_local) / hw.a2a_net_bw);
}

CommBreakdown training_comm(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                            const TrainSetup& s, double backward_seconds) {
  const Layout& l = s.layout;
  const int act_bytes = s.bf16 ? 2 : 4;
  const double tokens = static_cast<double>(s.tokens_per_micro());
  const double m = static_cast<double>(s.micro_batches());
  const double passes = s.recompute == Recompute::Full ? 3 : 2;  // fwd, bwd (+ fwd again)
  const auto stages = stage_layers(c.num_hidden_layers, l.pp);
  CommBreakdown out;
  auto add = [&](CommItem it) {
    if (it.bytes <= 0) return;
    out.items.push_back(std::move(it));
  };

  // The busiest stage sets the pace; take the largest per-stage volume of each kind.
  double shared = 0, routed = 0, moe_layers = 0, kda_layers = 0, mla_layers = 0;
  for (int64_t st = 0; st < l.pp; ++st) {
    double sh =
        (st == 0 ? pc.embedding : 0) + (st == l.pp - 1 ? pc.head + pc.model_level_other : 0);
    double ro = 0, moe = 0, kda = 0, mla = 0;
    for (int64_t i = stages[st].first; i < stages[st].second; ++i) {
      // Balancer-set tensors (no gradient) are neither reduced nor gathered.
      sh += pc.layers[i].shared - pc.layers[i].frozen;
      ro += pc.layers[i].routed / static_cast<double>(l.ep);
      moe += pc.layers[i].moe, kda += !pc.layers[i].mla, mla += pc.layers[i].mla;
    }
    shared = std::max(shared, sh), routed = std::max(routed, ro);
    moe_layers = std::max(moe_layers, moe), kda_layers = std::max(kda_layers, kda);
    mla_layers = std::max(mla_layers, mla);
  }

  // Data parallel (ZeRO): fp32 gradients reduce-scattered to their shard owners, updated bf16
  // weights all-gathered back. Non-expert weights replicate over dp·cp, experts over dp·cp/ep.
  const int64_t g_sh = l.dp * l.cp, g_ro = l.dp * l.cp / l.ep;
  const double f_sh = (g_sh - 1.0) / g_sh, f_ro = (g_ro - 1.0) / g_ro;
  const double wbytes = s.bf16 ? 2 : 4;
  auto ring = [&](const char* n, const char* what, int64_t g, int64_t stride, double bytes) {
    CommItem it{n, what, g, crosses(hw, g, stride), bytes};
    it.seconds = ring_seconds(hw, bytes, g, stride);
    return it;
  };
  std::vector<CommItem> dp = {
      ring("dp_reduce_scatter", "fp32 gradients of non-expert weights", g_sh, 1, f_sh * 4 * shared),
      ring("dp_all_gather", "updated non-expert weights", g_sh, 1, f_sh * wbytes * shared),
      ring("expert_reduce_scatter", "fp32 gradients of local experts over their replicas", g_ro,
           l.ep, f_ro * 4 * routed),
      ring("expert_all_gather", "updated expert weights", g_ro, l.ep, f_ro * wbytes * routed)};
  // Bucketed and overlapped with backward; what exceeds the backward time is exposed.
  double dp_s = 0;
  for (const auto& it : dp) dp_s += it.seconds;
  const double dp_exposed = std::max(0.0, dp_s - backward_seconds);
  for (auto& it : dp) {
    it.exposed = dp_s > 0 ? it.seconds * dp_exposed / dp_s : 0;
    add(it);
  }

  // Expert parallel: each token's k latent rows go to the expert ranks (dispatch) and their
  // outputs come back (combine) in every forward (and replay), and the gradients make the same
  // two trips in the backward. Forward dispatch is fp8 with one f32 scale per 128 values, as in
  // DeepEP; everything else moves in the activation dtype.
  if (l.ep > 1 && c.num_experts > 0) {
    const double lat = static_cast<double>(c.routed_expert_hidden_size.value_or(c.hidden_size));
    const double rows =
        (l.ep - 1.0) / l.ep * tokens * c.num_experts_per_token * lat * moe_layers * m;
    const double forwards = s.recompute == Recompute::Full ? 2 : 1;
    const double fp8 = s.bf16 ? 1 + 4.0 / 128 : act_bytes;
    CommItem d{"ep_dispatch", "latent rows to the expert ranks (fp8 forward, bf16 gradients)", l.ep,
               crosses(hw, l.ep, 1), rows * (forwards * fp8 + act_bytes)};
    CommItem b{"ep_combine", "expert outputs back (bf16), gradients the other way", l.ep,
               crosses(hw, l.ep, 1), rows * (forwards + 1) * act_bytes};
    for (CommItem* it : {&d, &b}) {
      it->seconds = all_to_all_seconds(hw, it->bytes, l.ep);
      it->exposed = it->seconds * (1 - kEpOverlap);
      add(*it);
    }
  }

  // Context parallel, Carry (the engine's): rank c hands rank c + 1 the decode state at its
  // chunk's end (per KDA layer the f32 state S [H, d_k, d_v] and the conv tail [3P, K-1]; per MLA
  // layer the latents [c ; k_pe] of the (c + 1) L tokens so far) and gets its gradient back.
  // Per device: the mean over the cp ranks of a group.
  if (l.cp > 1 && s.cp_mode == CpMode::Carry) {
    const auto& lac = c.linear_attn_config;
    const double P = static_cast<double>(lac.num_heads * lac.head_dim);
    const double kda = static_cast<double>(lac.num_heads * lac.head_dim * lac.head_dim) * 4 +
                       3 * P * static_cast<double>(lac.short_conv_kernel_size - 1) * act_bytes;
    const double lat = static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) * act_bytes;
    const double L = static_cast<double>(s.seq / l.cp);
    double hand = 0;  // bytes over the cp - 1 hand-offs of one sequence
    for (int64_t k = 0; k + 1 < l.cp; ++k)
      hand += kda_layers * kda + mla_layers * static_cast<double>(k + 1) * L * lat;
    const double seqs = static_cast<double>(s.micro_batch);
    CommItem it{"cp_state",
                "chunk-end decode state rank to rank (KDA state, conv tail, MLA "
                "latents so far), its gradient back",
                l.cp, crosses(hw, l.cp, 1), 2 * hand / static_cast<double>(l.cp) * seqs * m};
    it.seconds = it.bytes / (it.network ? hw.net_bw : hw.link_bw);
    it.exposed = it.seconds;  // the chunks run one after another
    add(it);
  }
  // Context parallel, Scan. KDA (§4.5): one all-gather of each rank's segment transition M_i and
  // zero-start state S̃_i (f32 [H, d_k, d_k] each), forward and backward, plus the conv tail.
  if (l.cp > 1 && s.cp_mode == CpMode::Scan) {
    const auto& lac = c.linear_attn_config;
    const double H = lac.num_heads, dk = lac.head_dim, P = H * dk;
    const double seqs = static_cast<double>(s.micro_batch);
    const double scan =
        (l.cp - 1.0) * 2 * H * dk * dk * 4 + 3 * (lac.short_conv_kernel_size - 1) * P * act_bytes;
    CommItem kda{"cp_kda_scan", "segment transitions and states (prefix scan), conv tails", l.cp,
                 crosses(hw, l.cp, 1), scan * seqs * kda_layers * m * passes};
    kda.seconds = ring_seconds(hw, kda.bytes, l.cp, 1);
    kda.exposed = kda.seconds;  // on the critical path between segments
    add(kda);
    // MLA: every rank needs the earlier ranks' latents [c ; k_pe]; gathered forward and
    // reduce-scattered backward.
    const double lat = (l.cp - 1.0) * tokens * (c.kv_lora_rank + c.qk_rope_head_dim) * act_bytes;
    CommItem mla{"cp_mla_latents", "MLA latents of the other segments (all-gather)", l.cp,
                 crosses(hw, l.cp, 1), lat * mla_layers * m * passes};
    mla.seconds = ring_seconds(hw, mla.bytes, l.cp, 1);
    mla.exposed = mla.seconds * 0.5;  // overlappable with the KDA layers in between
    add(mla);
  }

  // Pipeline: each micro-batch's boundary activations forward and their gradients back; under
  // Block AttnRes the completed block sums travel too.
  if (l.pp > 1) {
    double width = c.hidden_size;
    if (c.uses_attn_res()) {
      const double blocks = std::ceil(static_cast<double>(c.num_hidden_layers) /
                                      static_cast<double>(c.attn_res_block_size));
      width *= blocks + 1;  // the largest boundary: all completed blocks plus P
    }
    CommItem pp{"pp_send_recv", "boundary activations and their gradients", 2,
                crosses(hw, 2, l.dp * l.cp), tokens * width * act_bytes * m * passes};
    pp.seconds = pp.bytes / (pp.network ? hw.net_bw : hw.link_bw);
    pp.exposed = pp.seconds / m;  // only the first hand-off is not hidden
    add(pp);
  }

  // Quantile Balancing: one histogram all-reduce per MoE layer and step over the whole stage
  // (TRAINING.md §3.2), with the expert counts and the token count (int32) that every balancer
  // (and the load monitor) reduces.
  if (c.num_experts > 0 && g_sh > 1) {
    const double n = static_cast<double>(c.num_experts);
    const double per_layer =
        (c.myriad.balancer.mode == "quantile" ? n * c.myriad.balancer.bins + n + 1 : n + 1) * 4;
    CommItem qb{"balancer_all_reduce",
                c.myriad.balancer.mode == "quantile" ? "QB histograms (int32)" : "expert counts",
                g_sh, crosses(hw, g_sh, 1), 2 * f_sh * per_layer * moe_layers};
    qb.seconds = ring_seconds(hw, qb.bytes, g_sh, 1);
    qb.exposed = qb.seconds;
    add(qb);
  }
  for (const auto& it : out.items)
    out.bytes += it.bytes, out.seconds += it.seconds, out.exposed += it.exposed;
  return out;
}

}  // namespace myriad::plan
