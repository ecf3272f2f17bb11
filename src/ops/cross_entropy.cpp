// Cross-entropy: checks, autograd, the fused linear + cross-entropy driver, and the plain
// reference rows kernel. Losses and logit gradients are computed in f32 (f64 for f64 inputs,
// which go through the reference kernels for the gradient checks).
#include "ops/cross_entropy.h"

#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/matmul.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<CrossEntropyRowsKernel>& cross_entropy_rows_kernels() {
  static KernelTable<CrossEntropyRowsKernel> t("cross_entropy_rows");
  return t;
}

namespace {

// Loss and logit-gradient dtype for inputs of dtype t.
DType compute_dtype(DType t) {
  return t == DType::F64 ? DType::F64 : DType::F32;
}

// Checks targets [n] against V (and weights [n], when given) and returns the mean's denominator:
// how many rows count (target != kIgnoreIndex), or the sum of their weights.
double check_targets(const char* op, const Tensor& targets, int64_t n, int64_t v,
                     const Tensor& weights = Tensor()) {
  MYRIAD_CHECK(targets.dtype() == DType::I64 || targets.dtype() == DType::I32, op,
               ": targets must be i32 or i64, got ", targets.desc());
  MYRIAD_CHECK(targets.dim() == 1 && targets.shape()[0] == n, op, ": targets must be [", n,
               "], got ", targets.desc());
  std::vector<double> w;
  if (weights.defined()) {
    MYRIAD_CHECK(weights.dim() == 1 && weights.shape()[0] == n && is_floating(weights.dtype()), op,
                 ": weights must be a floating [", n, "] tensor, got ", weights.desc());
    w = weights.to_doubles();
  }
  double count = 0;
  std::vector<int64_t> t = targets.to_ints();  // N values; a host copy for device tensors
  for (int64_t i = 0; i < n; ++i) {
    if (t[i] == kIgnoreIndex) continue;
    MYRIAD_CHECK(t[i] >= 0 && t[i] < v, op, ": target ", t[i], " at row ", i,
                 " is out of range for V = ", v, " (use ", kIgnoreIndex, " to skip a row)");
    MYRIAD_CHECK(w.empty() || (std::isfinite(w[i]) && w[i] >= 0), op, ": weight ",
                 w.empty() ? 0.0 : w[i], " at row ", i, " is not a finite non-negative number");
    count += w.empty() ? 1.0 : w[i];
  }
  return count;
}

// Rows [r0, r0 + m) of a contiguous 2-d (or 1-d) tensor, as a view.
Tensor rows(const Tensor& t, int64_t r0, int64_t m) {
  if (t.dim() == 1) return t.view_as_strided({m}, {1}, t.offset() + r0);
  const int64_t cols = t.shape()[1];
  return t.view_as_strided({m, cols}, {cols, 1}, t.offset() + r0 * cols);
}

// 1 / the mean's denominator (1 when nothing counts: the loss and its gradient are then 0).
double inverse(double count) {
  return count > 0 ? 1.0 / count : 1.0;
}

// The mean over counted rows of per-row losses (a 0-d tensor of loss_rows' dtype).
Tensor mean_loss(const Tensor& loss_rows, double count) {
  NoGradGuard no_grad;
  if (loss_rows.numel() == 0) return Tensor::zeros({}, loss_rows.dtype(), loss_rows.device());
  return mul(sum(loss_rows), inverse(count));
}

// g_loss / count as a 0-d tensor of dtype ct.
Tensor grad_scale(const Tensor& g, double count, DType ct) {
  return mul(g.to(ct), inverse(count));
}
// t * s computed in s's dtype, returned in dtype dt.
Tensor scaled(const Tensor& t, const Tensor& s, DType dt) {
  return mul(t.to(s.dtype()), s).to(dt);
}

}  // namespace

Tensor cross_entropy(const Tensor& logits, const Tensor& targets) {
  const char* name = "cross_entropy";
  Device dev = check_inputs(name, {&logits, &targets});
  check_floating(name, logits);
  check_dim(name, logits, 2);
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  MYRIAD_CHECK(v >= 1, name, ": logits need at least one class, got ", logits.desc());
  const double count = check_targets(name, targets, n, v);
  const DType ct = compute_dtype(logits.dtype());
  const bool grad = needs_grad({&logits});
  // The kernel overwrites its logits with the gradient: work on a private copy then.
  Tensor work = logits.to(ct).contiguous();
  if (grad && work.storage() == logits.storage()) work = work.clone();
  Tensor loss_rows = Tensor::empty({n}, ct, dev);
  if (n > 0) cross_entropy_rows_kernels().get(dev, ct)(work, targets.contiguous(), loss_rows, grad);
  Tensor out = mean_loss(loss_rows, count);
  if (grad) {
    record(
        name, out, {logits, targets},
        [dl = work.detach(), count, dt = logits.dtype()](const Tensor& g) -> std::vector<Tensor> {
          return {scaled(dl, grad_scale(g, count, dl.dtype()), dt), Tensor()};
        });
  }
  return out;
}

Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            int64_t chunk_rows, const Tensor& weights) {
  const char* name = "linear_cross_entropy";
  Device dev = check_inputs(name, {&h, &w, &targets});
  check_floating(name, h);
  check_same_dtype(name, {&h, &w});
  check_dim(name, h, 2);
  check_dim(name, w, 2);
  MYRIAD_CHECK(h.shape()[1] == w.shape()[1], name, ": h ", h.desc(), " and w ", w.desc(),
               " differ in the hidden size (h is [N, D], w is [V, D])");
  MYRIAD_CHECK(chunk_rows >= 1, name, ": chunk_rows must be positive, got ", chunk_rows);
  const int64_t n = h.shape()[0], d = h.shape()[1], v = w.shape()[0];
  MYRIAD_CHECK(v >= 1, name, ": w needs at least one class, got ", w.desc());
  const double count = check_targets(name, targets, n, v, weights);
  const DType dt = h.dtype(), ct = compute_dtype(dt);
  const bool low = dt != ct;  // bf16/f16 inputs: GEMMs in dt, softmax and the sum of dw in f32
  const bool gh = needs_grad({&h}), gw = needs_grad({&w});
  Tensor hc = h.contiguous(), wc = w.contiguous(), tg = targets.contiguous();
  const Tensor wt = weights.defined() ? weights.detach().to(ct).to(dev).contiguous() : Tensor();
  Tensor loss_rows = Tensor::empty({n}, ct, dev);
  Tensor dh = gh ? Tensor::empty({n, d}, dt, dev) : Tensor();
  // dw is accumulated over chunks in f32; the first chunk's GEMM (beta 0) initialises it.
  Tensor dw = !gw ? Tensor() : n ? Tensor::empty({v, d}, ct, dev) : Tensor::zeros({v, d}, ct, dev);
  // Per-chunk buffers, reused: only [c, V] logits ever exist.
  const int64_t c = std::max<int64_t>(1, std::min(chunk_rows, n));
  // bf16 logits straight into the rows kernel (no f32 copy of them, none of dlogits back) where
  // that kernel takes them: unweighted rows on the CPU (its bits are those of the copies).
  const bool rows_low =
      low && dt == DType::BF16 && !wt.defined() && backend_for(dev, dt) == Backend::CPU;
  Tensor logits_low = low ? Tensor::empty({c, v}, dt, dev) : Tensor();
  Tensor logits = rows_low ? logits_low : Tensor::empty({c, v}, ct, dev);
  // bf16 inputs: each chunk's dw as a bf16 GEMM (f32 accumulation inside, on the bf16 dlogits the
  // dh GEMM uses), added into the f32 dw.
  Tensor dw_low = low && gw ? Tensor::empty({v, d}, dt, dev) : Tensor();
  auto gemm_args = [&](DType t) {
    GemmArgs a;
    a.dtype = t;
    a.device = dev;
    return a;
  };
  for (int64_t r0 = 0; r0 < n; r0 += c) {
    const int64_t m = std::min(c, n - r0);
    Tensor hm = rows(hc, r0, m), lg = rows(logits, 0, m);
    // logits = h_chunk . w^T (f32 accumulation; rounded to dt first for low-precision inputs)
    GemmArgs a = gemm_args(dt);
    a.m = m, a.n = v, a.k = d, a.trans_b = true;
    a.a = hm.data_ptr(), a.lda = d, a.b = wc.data_ptr(), a.ldb = d;
    a.c = (low ? logits_low : logits).data_ptr(), a.ldc = v;
    gemm(a);
    Tensor lm = rows(loss_rows, r0, m);
    if (low && !rows_low) lg.copy_(rows(logits_low, 0, m));
    // (with rows_low, lg is the bf16 logits: the CPU kernel writes the bf16 dlogits in place)
    cross_entropy_rows_kernels().get(dev, lg.dtype())(lg, rows(tg, r0, m), lm, gh || gw);
    if (wt.defined()) {  // weighted rows: scale each row's loss and logit gradient by its weight
      NoGradGuard no_grad;
      const Tensor wm = rows(wt, r0, m);
      lm.copy_(mul(lm, wm));
      if (gh || gw) lg.copy_(mul(lg, reshape(wm, {m, 1})));
    }
    Tensor dl = lg;  // dlogits in dt (already so with rows_low)
    if (low && !rows_low && (gh || gw)) {
      dl = rows(logits_low, 0, m);
      dl.copy_(lg);
    }
    if (gh) {  // dh_chunk = dlogits . w
      GemmArgs b = gemm_args(dt);
      b.m = m, b.n = d, b.k = v;
      b.a = dl.data_ptr(), b.lda = v, b.b = wc.data_ptr(), b.ldb = d;
      b.c = rows(dh, r0, m).data_ptr(), b.ldc = d;
      gemm(b);
    }
    if (gw) {  // dw += dlogits^T . h_chunk
      GemmArgs b = gemm_args(dt);
      b.m = v, b.n = d, b.k = m, b.trans_a = true;
      b.a = dl.data_ptr(), b.lda = v, b.b = hm.data_ptr(), b.ldb = d;
      b.c = (low ? dw_low : dw).data_ptr(), b.ldc = d, b.beta = r0 == 0 || low ? 0.0f : 1.0f;
      gemm(b);
      if (low && r0 == 0) {
        dw.copy_(dw_low);
      } else if (low) {
        add_(dw, dw_low.to(ct));
      }
    }
  }
  Tensor out = mean_loss(loss_rows, count);
  if (gh || gw) {
    record(name, out, {h, w, targets},
           [dh, dw, count, dt, ct](const Tensor& g) -> std::vector<Tensor> {
             Tensor s = grad_scale(g, count, ct);
             return {dh.defined() ? scaled(dh, s, dt) : Tensor(),
                     dw.defined() ? scaled(dw, s, dt) : Tensor(), Tensor()};
           });
  }
  return out;
}

// ---- reference kernel: plain loops in double ----
namespace {

void cross_entropy_rows_ref(Tensor& logits, const Tensor& targets, Tensor& loss, bool grad) {
  const int64_t n = logits.shape()[0], v = logits.shape()[1];
  const DType t = logits.dtype();
  void* p = logits.data_ptr();
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tgt =
        static_cast<int64_t>(load_as_double(targets.data_ptr(), targets.dtype(), r));
    const int64_t base = r * v;
    if (tgt == kIgnoreIndex) {
      store_from_double(loss.data_ptr(), loss.dtype(), r, 0.0);
      if (grad)
        for (int64_t i = 0; i < v; ++i) store_from_double(p, t, base + i, 0.0);
      continue;
    }
    MYRIAD_CHECK(tgt >= 0 && tgt < v, "cross_entropy: target ", tgt, " at row ", r,
                 " is out of range for V = ", v);
    double m = -std::numeric_limits<double>::infinity();
    for (int64_t i = 0; i < v; ++i) m = std::max(m, load_as_double(p, t, base + i));
    double s = 0;
    for (int64_t i = 0; i < v; ++i) s += std::exp(load_as_double(p, t, base + i) - m);
    const double lse = m + std::log(s);
    store_from_double(loss.data_ptr(), loss.dtype(), r, lse - load_as_double(p, t, base + tgt));
    if (grad)
      for (int64_t i = 0; i < v; ++i)
        store_from_double(p, t, base + i,
                          std::exp(load_as_double(p, t, base + i) - lse) - (i == tgt ? 1.0 : 0.0));
  }
}

}  // namespace

MYRIAD_REGISTER_KERNEL(cross_entropy_rows_kernels, Backend::Reference, &cross_entropy_rows_ref);

}  // namespace myriad::ops
