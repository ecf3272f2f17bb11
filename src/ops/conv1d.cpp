// Depthwise causal conv1d: checks, autograd through the dedicated backward kernel, the carried
// state, and the reference kernels.
#include "ops/conv1d.h"

#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<Conv1dKernel>& conv1d_kernels() {
  static KernelTable<Conv1dKernel> t("conv1d_causal");
  return t;
}
KernelTable<Conv1dBackwardKernel>& conv1d_backward_kernels() {
  static KernelTable<Conv1dBackwardKernel> t("conv1d_causal_backward");
  return t;
}

namespace {
void check_state(const char* op, const Tensor& x, const Tensor& state, int64_t K) {
  Shape want{x.shape()[0], x.shape()[2], K - 1};
  MYRIAD_CHECK(state.shape() == want, op, ": state ", state.desc(), " should have shape ",
               shape_str(want), " for x ", x.desc(), " and kernel size ", K);
}
}  // namespace

Tensor conv1d_causal(const Tensor& x, const Tensor& w, const Tensor& state) {
  const char* op = "conv1d_causal";
  const bool has_state = state.defined();
  Device dev = has_state ? check_inputs(op, {&x, &w, &state}) : check_inputs(op, {&x, &w});
  check_floating(op, x);
  if (has_state)
    check_same_dtype(op, {&x, &w, &state});
  else
    check_same_dtype(op, {&x, &w});
  MYRIAD_CHECK(x.dim() == 3 && w.dim() == 2 && w.shape()[1] >= 1 && w.shape()[0] == x.shape()[2],
               op, ": expected x [B, T, C] and w [C, K] with K >= 1, got ", descs({&x, &w}));
  if (has_state) check_state(op, x, state, w.shape()[1]);
  Tensor xc = x.detach().contiguous(), wc = w.detach().contiguous();
  Tensor sc = has_state ? state.detach().contiguous() : Tensor();
  Tensor y = Tensor::empty(x.shape(), x.dtype(), dev);
  conv1d_kernels().get(dev, x.dtype())(xc, wc, sc, y);
  if (needs_grad({&x, &w, &state}))
    record(op, y, {x, w, state}, [xc, wc, sc](const Tensor& g) -> std::vector<Tensor> {
      Tensor gx = Tensor::empty(xc.shape(), xc.dtype(), xc.device());
      Tensor gw = Tensor::empty(wc.shape(), wc.dtype(), wc.device());
      Tensor gs = sc.defined() ? Tensor::empty(sc.shape(), sc.dtype(), sc.device()) : Tensor();
      conv1d_backward_kernels().get(xc.device(), xc.dtype())(xc, wc, sc, g.contiguous(), gx, gw,
                                                             gs);
      return {gx, gw, gs};
    });
  return y;
}

Tensor conv1d_next_state(const Tensor& x, const Tensor& state, int64_t kernel_size) {
  const char* op = "conv1d_next_state";
  if (state.defined()) {
    check_inputs(op, {&x, &state});
    check_same_dtype(op, {&x, &state});
  } else {
    check_inputs(op, {&x});
  }
  MYRIAD_CHECK(x.dim() == 3 && kernel_size >= 1, op,
               ": expected x [B, T, C] and a kernel size >= 1, got ", x.desc(), " and ",
               kernel_size);
  if (state.defined()) check_state(op, x, state, kernel_size);
  const int64_t T = x.shape()[1], P = kernel_size - 1;
  Tensor xt = transpose(x, 1, 2);  // [B, C, T]
  if (T >= P) return contiguous(slice(xt, 2, T - P, T));
  Tensor s = state.defined()
                 ? state
                 : Tensor::zeros({x.shape()[0], x.shape()[2], P}, x.dtype(), x.device());
  return concat({slice(s, 2, T, P), xt}, 2);
}

// ---- reference kernels: plain loops in double over the padded input ----
namespace {

struct Conv {
  const Tensor &x, &w, &state;
  int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], K = w.shape()[1], P = K - 1;
  // xpad[b, p, c]: the state for p < P, x after.
  double xpad(int64_t b, int64_t p, int64_t c) const {
    if (p >= P) return load_as_double(x.data_ptr(), x.dtype(), (b * T + p - P) * C + c);
    return state.defined() ? load_as_double(state.data_ptr(), state.dtype(), (b * C + c) * P + p)
                           : 0.0;
  }
  double tap(int64_t c, int64_t j) const {
    return load_as_double(w.data_ptr(), w.dtype(), c * K + j);
  }
};

void conv1d_ref(const Tensor& x, const Tensor& w, const Tensor& state, Tensor& y) {
  Conv cv{x, w, state};
  for (int64_t b = 0; b < cv.B; ++b)
    for (int64_t t = 0; t < cv.T; ++t)
      for (int64_t c = 0; c < cv.C; ++c) {
        double acc = 0;
        for (int64_t j = 0; j < cv.K; ++j) acc += cv.tap(c, j) * cv.xpad(b, t + j, c);
        store_from_double(y.data_ptr(), y.dtype(), (b * cv.T + t) * cv.C + c, acc);
      }
}

void conv1d_backward_ref(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& gy,
                         Tensor& gx, Tensor& gw, Tensor& gstate) {
  Conv cv{x, w, state};
  const int64_t B = cv.B, T = cv.T, C = cv.C, K = cv.K, P = cv.P;
  std::vector<double> gpad(B * (T + P) * C, 0.0), gwv(C * K, 0.0);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t c = 0; c < C; ++c) {
        double g = load_as_double(gy.data_ptr(), gy.dtype(), (b * T + t) * C + c);
        for (int64_t j = 0; j < K; ++j) {
          gwv[c * K + j] += g * cv.xpad(b, t + j, c);
          gpad[(b * (T + P) + t + j) * C + c] += g * cv.tap(c, j);
        }
      }
  for (int64_t b = 0; b < B; ++b)
    for (int64_t p = 0; p < T + P; ++p)
      for (int64_t c = 0; c < C; ++c) {
        double v = gpad[(b * (T + P) + p) * C + c];
        if (p >= P)
          store_from_double(gx.data_ptr(), gx.dtype(), (b * T + p - P) * C + c, v);
        else if (gstate.defined())
          store_from_double(gstate.data_ptr(), gstate.dtype(), (b * C + c) * P + p, v);
      }
  for (int64_t i = 0; i < C * K; ++i) store_from_double(gw.data_ptr(), gw.dtype(), i, gwv[i]);
}

}  // namespace
MYRIAD_REGISTER_KERNEL(conv1d_kernels, Backend::Reference, &conv1d_ref);
MYRIAD_REGISTER_KERNEL(conv1d_backward_kernels, Backend::Reference, &conv1d_backward_ref);

}  // namespace myriad::ops
