// KDA (Kimi Delta Attention, MODEL.md §4): the gated delta-rule recurrence with a per-channel
// decay, its gates, and the q/k L2 norm.
//
// Per batch row and head, with state S [K, V] (row = key channel) and q pre-multiplied by scale:
//   S = Diag(exp(g_t)) S;  S += beta_t k_t (v_t - S^T k_t)^T;  o_t = S^T q_t.
// kda() runs the chunkwise-parallel WY/UT form of §4.4 in f32. The in-chunk decays are
// exponentials of differences of the cumulative log-decay, masked before exponentiating; where
// §4.7 allows it (every gate <= 0, bounded span over a 16-token tile) the CPU kernel evaluates
// them as products of two bounded factors so the tiles run as small GEMMs. Its backward is a
// fused chunkwise adjoint that recomputes each chunk's quantities from the chunk-boundary states
// saved by the forward, processing chunks in reverse; the gradient of the final state flows
// into the same pass, so segment-by-segment training through the carried state is exact.
// The Reference kernels are the plain recurrent form of §4.3 in double, with a token-by-token
// reverse adjoint (states recomputed per chunk from the same saved boundary states).
#pragma once
#include "core/tensor.h"
#include "ops/dispatch.h"
#include "ops/rmsnorm.h"

namespace myriad::ops {

struct KdaOutput {
  Tensor o;            // [B, T, H, V] in q's dtype
  Tensor final_state;  // [B, H, K, V], f32 (f64 for f64 inputs)
};

// q, k [B, T, H, K], v [B, T, H, V] share one dtype (f32, bf16, or f64 for the reference);
// g [B, T, H, K] (log-decay) and beta [B, T, H] are computed in f32 whatever their dtype;
// initial_state [B, H, K, V] or undefined for zeros. scale <= 0 selects K^-1/2. Differentiable
// in every tensor input, through both outputs.
KdaOutput kda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, const Tensor& initial_state = {}, double scale = -1.0,
              int64_t chunk_size = 64);
// One decode step (T = 1, same layouts as kda): equals kda() on a single token. Without
// autograd it runs the direct recurrent update; when an input needs a gradient it is kda().
KdaOutput kda_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                   const Tensor& beta, const Tensor& state = {}, double scale = -1.0);

// Gates (MODEL.md §4.2 step 5, fla's naive_kda_gate / naive_kda_lowerbound_gate), computed in
// f32 (f64 for f64 z) and returned in that dtype, shaped like z. z [..., H*K]; A_log has H
// elements (any shape, e.g. [H] or [1, 1, H, 1]); dt_bias [H*K] or undefined. dt_bias is added
// to z before anything else.
//   softplus:    g = -exp(A_log_h) * softplus(z + dt_bias)
//   lower bound: g = g_min * sigmoid(exp(A_log_h) * (z + dt_bias)); A_log may be undefined
//                (then g = g_min * sigmoid(z + dt_bias)).
Tensor kda_gate_softplus(const Tensor& z, const Tensor& A_log, const Tensor& dt_bias = {});
Tensor kda_gate_lower_bound(const Tensor& z, const Tensor& A_log, const Tensor& dt_bias = {},
                            double g_min = -5.0);
// l2norm (fla's, for q and k): ops/rmsnorm.h.

// ---- kernels ----
// q, k, v contiguous in one dtype X; g, beta, h0 contiguous in the accumulation dtype A (f64
// when X is f64, else f32); h0 may be undefined (zeros). scale is final (> 0).
struct KdaArgs {
  Tensor q, k, v, g, beta, h0;
  double scale = 1.0;
  int64_t chunk = 64;
};
// What the forward keeps for the backward. states [B, H, NC, K, V] in A (NC = ceil(T / chunk)):
// the state entering each chunk, or undefined when no backward will run. u [B, H, T, V] in A:
// the chunk solve's rows before their β scaling (Ṽ = Diag(β) U, MODEL.md §4.4), which a kernel
// may keep when states is defined (the CPU kernel does: its backward then neither reads v nor
// repeats R = V - Kg S and the solve); left undefined by kernels that do not.
struct KdaSaved {
  Tensor states, u;
};
// o [B, T, H, V] and ht [B, H, K, V] in A, and saved as above.
using KdaKernel = void (*)(const KdaArgs& a, Tensor& o, Tensor& ht, KdaSaved& saved);
// From the saved boundary states (and U where kept), d_o [B, T, H, V] and dht [B, H, K, V] (both
// A): dq, dk, dv in X and dg, dbeta, dh0 in A, all overwritten.
struct KdaGrads {
  Tensor dq, dk, dv, dg, dbeta, dh0;
};
using KdaBackwardKernel = void (*)(const KdaArgs& a, const KdaSaved& saved, const Tensor& d_o,
                                   const Tensor& dht, KdaGrads& grads);
// One token (T = 1): o [B, 1, H, V] and new_state [B, H, K, V] in A.
using KdaStepKernel = void (*)(const KdaArgs& a, Tensor& o, Tensor& new_state);
KernelTable<KdaKernel>& kda_kernels();
KernelTable<KdaBackwardKernel>& kda_backward_kernels();
KernelTable<KdaStepKernel>& kda_step_kernels();

// The gates' element-wise part, fused (one pass forward, one backward, where the composition
// of casts, add, softplus or sigmoid, mul and neg made about a dozen): x = z + bias and
//   Softplus:   g = -a_h * softplus(x)           (softplus(x) = x for x > 20)
//   LowerBound: g = g_min * sigmoid(a_h * x)
// for column p of head h = p / (P / H). z [rows, P] contiguous in X; bias [P] in A or undefined
// (zeros); a [H] in A (exp(A_log), or ones); g [rows, P] in A.
enum class KdaGateKind : uint8_t { Softplus, LowerBound };
struct KdaGateArgs {
  KdaGateKind kind = KdaGateKind::Softplus;
  double g_min = -5.0;
  Tensor z, bias, a;
};
using KdaGateKernel = void (*)(const KdaGateArgs& args, Tensor& g);
// From dg [rows, P] (A): dz [rows, P] (X) = dg * dg/dx, dbias [P] (A, when defined) its sum over
// rows, and da [H] (A) = the sum of dg * dg/da_h; all overwritten. The softplus's derivative is
// sigmoid(x), 1 for x > 20.
using KdaGateBackwardKernel = void (*)(const KdaGateArgs& args, const Tensor& dg, Tensor& dz,
                                       Tensor& dbias, Tensor& da);
KernelTable<KdaGateKernel>& kda_gate_kernels();
KernelTable<KdaGateBackwardKernel>& kda_gate_backward_kernels();

}  // namespace myriad::ops
