// KDA: checks, autograd through the fused backward kernel, the gates as compositions of
// element-wise ops, and the plain recurrent reference kernels (in double).
#include "ops/kda.h"

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<KdaKernel>& kda_kernels() {
  static KernelTable<KdaKernel> t("kda");
  return t;
}
KernelTable<KdaBackwardKernel>& kda_backward_kernels() {
  static KernelTable<KdaBackwardKernel> t("kda_backward");
  return t;
}
KernelTable<KdaStepKernel>& kda_step_kernels() {
  static KernelTable<KdaStepKernel> t("kda_step");
  return t;
}

namespace {

DType acc_dtype(DType x) {
  return x == DType::F64 ? DType::F64 : DType::F32;
}

// A dtype conversion that passes the gradient back converted to the source dtype.
Tensor cast(const Tensor& x, DType t) {
  if (x.dtype() == t) return x;
  Tensor y = x.to(t);
  record("cast", y, {x},
         [src = x.dtype()](const Tensor& g) -> std::vector<Tensor> { return {g.to(src)}; });
  return y;
}

// Checks shapes and dtypes and builds the kernel arguments (inputs made contiguous, g, beta and
// h0 converted to the accumulation dtype).
KdaArgs prepare(const char* name, const Tensor& q, const Tensor& k, const Tensor& v,
                const Tensor& g, const Tensor& beta, const Tensor& h0, double scale,
                int64_t chunk) {
  if (h0.defined())
    check_inputs(name, {&q, &k, &v, &g, &beta, &h0});
  else
    check_inputs(name, {&q, &k, &v, &g, &beta});
  check_same_dtype(name, {&q, &k, &v});
  for (const Tensor* t : {&q, &g, &beta}) check_floating(name, *t);
  if (h0.defined()) check_floating(name, h0);
  check_dim(name, q, 4);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3);
  const std::string all =
      h0.defined() ? descs({&q, &k, &v, &g, &beta, &h0}) : descs({&q, &k, &v, &g, &beta});
  MYRIAD_CHECK(k.shape() == q.shape() && g.shape() == q.shape(), name,
               ": q, k and g must all be [B, T, H, K]; got ", all);
  MYRIAD_CHECK(v.dim() == 4 && v.size(0) == B && v.size(1) == T && v.size(2) == H, name,
               ": v must be [B, T, H, V] matching q [B, T, H, K]; got ", all);
  const int64_t V = v.size(3);
  MYRIAD_CHECK(beta.shape() == Shape({B, T, H}), name,
               ": beta must be [B, T, H] = ", shape_str({B, T, H}), "; got ", all);
  if (h0.defined())
    MYRIAD_CHECK(h0.shape() == Shape({B, H, K, V}), name,
                 ": the state must be [B, H, K, V] = ", shape_str({B, H, K, V}), "; got ", all);
  MYRIAD_CHECK(chunk >= 1, name, ": chunk_size must be positive, got ", chunk);
  MYRIAD_CHECK(std::isfinite(scale), name, ": scale must be finite, got ", scale);
  const DType a = acc_dtype(q.dtype());
  KdaArgs args;
  args.q = q.contiguous();
  args.k = k.contiguous();
  args.v = v.contiguous();
  args.g = g.to(a).contiguous();
  args.beta = beta.to(a).contiguous();
  if (h0.defined()) args.h0 = h0.to(a).contiguous();
  args.scale = scale > 0 ? scale : 1.0 / std::sqrt(static_cast<double>(K));
  args.chunk = chunk;
  return args;
}

}  // namespace

KdaOutput kda(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
              const Tensor& beta, const Tensor& initial_state, double scale, int64_t chunk_size) {
  const char* name = "kda";
  KdaArgs args = prepare(name, q, k, v, g, beta, initial_state, scale, chunk_size);
  const int64_t B = q.size(0), T = q.size(1), H = q.size(2), K = q.size(3), V = v.size(3);
  const int64_t NC = (T + chunk_size - 1) / chunk_size;
  const DType a = args.g.dtype();
  const Device dev = q.device();
  const bool grad = needs_grad({&q, &k, &v, &g, &beta, &initial_state});
  // One buffer holds both outputs, so a single autograd node receives both gradients.
  const int64_t n_o = B * T * H * V, n_s = B * H * K * V;
  Tensor packed = Tensor::empty({n_o + n_s}, a, dev);
  Tensor o = packed.view_as_strided({B, T, H, V}, contiguous_strides({B, T, H, V}), 0);
  Tensor ht = packed.view_as_strided({B, H, K, V}, contiguous_strides({B, H, K, V}), n_o);
  KdaSaved saved;
  if (grad) saved.states = Tensor::empty({B, H, NC, K, V}, a, dev);
  kda_kernels().get(dev, q.dtype())(args, o, ht, saved);
  if (grad) {
    KdaArgs sv = args;
    for (Tensor* t : {&sv.q, &sv.k, &sv.v, &sv.g, &sv.beta, &sv.h0})
      if (t->defined()) *t = t->detach();
    record(name, packed, {q, k, v, g, beta, initial_state},
           [sv, saved, n_o, dt = std::vector<DType>{g.dtype(), beta.dtype()},
            h0_dtype = initial_state.defined() ? initial_state.dtype() : a,
            has_h0 = initial_state.defined()](const Tensor& gp) -> std::vector<Tensor> {
             const Shape& qs = sv.q.shape();
             const int64_t B = qs[0], T = qs[1], H = qs[2], K = qs[3], V = sv.v.size(3);
             Tensor gc = gp.to(sv.g.dtype()).contiguous();
             Tensor d_o =
                 gc.view_as_strided({B, T, H, V}, contiguous_strides({B, T, H, V}), gc.offset());
             Tensor dht = gc.view_as_strided({B, H, K, V}, contiguous_strides({B, H, K, V}),
                                             gc.offset() + n_o);
             const Device d = sv.q.device();
             const DType x = sv.q.dtype(), acc = sv.g.dtype();
             KdaGrads gr{Tensor::empty(qs, x, d),           Tensor::empty(qs, x, d),
                         Tensor::empty(sv.v.shape(), x, d), Tensor::empty(qs, acc, d),
                         Tensor::empty({B, T, H}, acc, d),  Tensor::empty({B, H, K, V}, acc, d)};
             kda_backward_kernels().get(d, x)(sv, saved, d_o, dht, gr);
             return {gr.dq,
                     gr.dk,
                     gr.dv,
                     gr.dg.to(dt[0]),
                     gr.dbeta.to(dt[1]),
                     has_h0 ? gr.dh0.to(h0_dtype) : Tensor()};
           });
  }
  KdaOutput out;
  out.o = cast(reshape(slice(packed, 0, 0, n_o), {B, T, H, V}), q.dtype());
  out.final_state = reshape(slice(packed, 0, n_o, n_o + n_s), {B, H, K, V});
  return out;
}

KdaOutput kda_step(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g,
                   const Tensor& beta, const Tensor& state, double scale) {
  const char* name = "kda_step";
  KdaArgs args = prepare(name, q, k, v, g, beta, state, scale, 1);
  MYRIAD_CHECK(q.size(1) == 1, name, ": expects one token (T = 1), got q ", q.desc());
  if (needs_grad({&q, &k, &v, &g, &beta, &state})) return kda(q, k, v, g, beta, state, scale);
  const int64_t B = q.size(0), H = q.size(2), K = q.size(3), V = v.size(3);
  const DType a = args.g.dtype();
  Tensor o = Tensor::empty({B, 1, H, V}, a, q.device());
  Tensor s = Tensor::empty({B, H, K, V}, a, q.device());
  kda_step_kernels().get(q.device(), q.dtype())(args, o, s);
  return {o.to(q.dtype()), s};
}

KernelTable<KdaGateKernel>& kda_gate_kernels() {
  static KernelTable<KdaGateKernel> t("kda_gate");
  return t;
}
KernelTable<KdaGateBackwardKernel>& kda_gate_backward_kernels() {
  static KernelTable<KdaGateBackwardKernel> t("kda_gate_backward");
  return t;
}

// ---- gates ----
namespace {

// Checks the gate's inputs; returns the number of heads H (1 without A_log).
int64_t check_gate(const char* name, const Tensor& z, const Tensor& A_log, const Tensor& dt_bias) {
  check_inputs(name, {&z});
  check_floating(name, z);
  MYRIAD_CHECK(z.dim() >= 1, name, ": z must be [..., H*K], got ", z.desc());
  const int64_t P = z.size(-1);
  int64_t H = A_log.defined() ? A_log.numel() : 0;
  if (A_log.defined()) {
    check_inputs(name, {&z, &A_log});
    check_floating(name, A_log);
    MYRIAD_CHECK(H > 0, name, ": A_log must have one element per head, got ", A_log.desc());
  }
  if (dt_bias.defined()) {
    check_inputs(name, {&z, &dt_bias});
    check_floating(name, dt_bias);
    MYRIAD_CHECK(dt_bias.numel() == P, name, ": dt_bias must have ", P,
                 " elements (the last dimension of z); got z ", z.desc(), " and dt_bias ",
                 dt_bias.desc());
  }
  if (H == 0) H = 1;
  MYRIAD_CHECK(P % H == 0, name, ": the last dimension of z (", P,
               ") must be a multiple of the number of heads in A_log (", H, "); got z ", z.desc(),
               A_log.defined() ? " and A_log " + A_log.desc() : std::string());
  return H;
}

Tensor gate(const char* name, KdaGateKind kind, const Tensor& z, const Tensor& A_log,
            const Tensor& dt_bias, double g_min) {
  const int64_t H = check_gate(name, z, A_log, dt_bias);
  const Device dev = z.device();
  const Backend be = backend_for(dev, z.dtype());
  const DType acc = acc_dtype(z.dtype());
  const int64_t P = z.size(-1), rows = P ? z.numel() / P : 0;
  // The per-head factor and the bias are small: their casts (and exp) stay ops, so autograd
  // carries their gradients back to A_log and dt_bias.
  KdaGateArgs args;
  args.kind = kind, args.g_min = g_min;
  args.a = A_log.defined() ? reshape(exp(cast(A_log, acc)), {H}) : Tensor::ones({H}, acc, dev);
  args.bias = dt_bias.defined() ? reshape(cast(dt_bias, acc), {P}) : Tensor();
  const Tensor zc = z.contiguous();
  args.z = zc.detach().view_as_strided({rows, P}, {P, 1}, zc.offset());
  Tensor g = Tensor::empty({rows, P}, acc, dev);
  const Tensor a_in = args.a, bias_in = args.bias;
  args.a = args.a.detach().contiguous();
  if (args.bias.defined()) args.bias = args.bias.detach().contiguous();
  if (rows > 0) kda_gate_kernels().get(be)(args, g);
  if (needs_grad({&z, &a_in, &bias_in})) {
    record(name, g, {z, bias_in, a_in},
           [args, shape = z.shape()](const Tensor& dg) -> std::vector<Tensor> {
             const Tensor dgc = dg.to(args.a.dtype()).contiguous();
             const Tensor dg2 = dgc.view_as_strided(args.z.shape(), args.z.strides(), dgc.offset());
             Tensor dz = Tensor::empty(args.z.shape(), args.z.dtype(), args.z.device());
             Tensor dbias = args.bias.defined()
                                ? Tensor::empty(args.bias.shape(), args.bias.dtype(), dz.device())
                                : Tensor();
             Tensor da = Tensor::empty(args.a.shape(), args.a.dtype(), dz.device());
             if (args.z.numel() > 0) {
               kda_gate_backward_kernels().get(dz.device(), args.z.dtype())(args, dg2, dz, dbias,
                                                                            da);
             } else {
               da = Tensor::zeros(args.a.shape(), args.a.dtype(), dz.device());
               if (dbias.defined())
                 dbias = Tensor::zeros(args.bias.shape(), args.bias.dtype(), dz.device());
             }
             return {dz.view_as_strided(shape, contiguous_strides(shape), 0), dbias, da};
           });
  }
  return reshape(g, z.shape());
}

}  // namespace

Tensor kda_gate_softplus(const Tensor& z, const Tensor& A_log, const Tensor& dt_bias) {
  MYRIAD_CHECK(A_log.defined(), "kda_gate_softplus: A_log is required");
  return gate("kda_gate_softplus", KdaGateKind::Softplus, z, A_log, dt_bias, 0.0);
}

Tensor kda_gate_lower_bound(const Tensor& z, const Tensor& A_log, const Tensor& dt_bias,
                            double g_min) {
  return gate("kda_gate_lower_bound", KdaGateKind::LowerBound, z, A_log, dt_bias, g_min);
}

// ---- reference kernels: the recurrent form (§4.3) in double ----
namespace {

struct RefView {  // element offsets of the [B, T, H, *] / [B, H, K, V] layouts
  int64_t B, T, H, K, V, NC, C;
  int64_t qk(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * K; }
  int64_t vo(int64_t b, int64_t t, int64_t h) const { return ((b * T + t) * H + h) * V; }
  int64_t bt(int64_t b, int64_t t, int64_t h) const { return (b * T + t) * H + h; }
  int64_t st(int64_t b, int64_t h) const { return (b * H + h) * K * V; }
  int64_t sv(int64_t b, int64_t h, int64_t c) const { return ((b * H + h) * NC + c) * K * V; }
};

RefView ref_view(const KdaArgs& a) {
  const Shape& s = a.q.shape();
  const int64_t V = a.v.size(3);
  return {s[0], s[1], s[2], s[3], V, (s[1] + a.chunk - 1) / a.chunk, a.chunk};
}

double ld(const Tensor& t, int64_t i) {
  return load_as_double(t.data_ptr(), t.dtype(), i);
}
void st(Tensor& t, int64_t i, double v) {
  store_from_double(t.data_ptr(), t.dtype(), i, v);
}

// One recurrent step on S [K*V]: decay, delta-rule write; returns nothing (S updated).
void ref_step(const KdaArgs& a, const RefView& r, int64_t b, int64_t t, int64_t h,
              std::vector<double>& S, std::vector<double>& e) {
  const int64_t K = r.K, V = r.V, iq = r.qk(b, t, h), iv = r.vo(b, t, h);
  for (int64_t d = 0; d < K; ++d) {
    const double alpha = std::exp(ld(a.g, iq + d));
    for (int64_t j = 0; j < V; ++j) S[d * V + j] *= alpha;
  }
  for (int64_t j = 0; j < V; ++j) {
    double p = 0;
    for (int64_t d = 0; d < K; ++d) p += S[d * V + j] * ld(a.k, iq + d);
    e[j] = ld(a.v, iv + j) - p;
  }
  const double beta = ld(a.beta, r.bt(b, t, h));
  for (int64_t d = 0; d < K; ++d) {
    const double bk = beta * ld(a.k, iq + d);
    for (int64_t j = 0; j < V; ++j) S[d * V + j] += bk * e[j];
  }
}

void kda_ref(const KdaArgs& a, Tensor& o, Tensor& ht, KdaSaved& kept) {
  Tensor& saved = kept.states;
  const RefView r = ref_view(a);
  const int64_t KV = r.K * r.V;
  std::vector<double> S(KV), e(r.V);
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h) {
      for (int64_t i = 0; i < KV; ++i) S[i] = a.h0.defined() ? ld(a.h0, r.st(b, h) + i) : 0.0;
      for (int64_t t = 0; t < r.T; ++t) {
        if (t % r.C == 0 && saved.defined())
          for (int64_t i = 0; i < KV; ++i) st(saved, r.sv(b, h, t / r.C) + i, S[i]);
        ref_step(a, r, b, t, h, S, e);
        const int64_t iq = r.qk(b, t, h), iv = r.vo(b, t, h);
        for (int64_t j = 0; j < r.V; ++j) {
          double acc = 0;
          for (int64_t d = 0; d < r.K; ++d) acc += a.scale * ld(a.q, iq + d) * S[d * r.V + j];
          st(o, iv + j, acc);
        }
      }
      for (int64_t i = 0; i < KV; ++i) st(ht, r.st(b, h) + i, S[i]);
    }
}

// The adjoint of the recurrence, token by token in reverse. Per chunk, the states are recomputed
// from the saved boundary state.
void kda_backward_ref(const KdaArgs& a, const KdaSaved& kept, const Tensor& d_o, const Tensor& dht,
                      KdaGrads& gr) {
  const Tensor& saved = kept.states;
  const RefView r = ref_view(a);
  const int64_t K = r.K, V = r.V, KV = K * V;
  std::vector<double> states, dS(KV), Sa(KV), e(V), de(V), dSe(K), qs(K), kk(K), alpha(K);
  for (int64_t b = 0; b < r.B; ++b)
    for (int64_t h = 0; h < r.H; ++h) {
      for (int64_t i = 0; i < KV; ++i) dS[i] = ld(dht, r.st(b, h) + i);
      for (int64_t c = r.NC - 1; c >= 0; --c) {
        const int64_t t0 = c * r.C, n = std::min(r.C, r.T - t0);
        states.assign((n + 1) * KV, 0.0);  // states[i] = S before token t0 + i
        for (int64_t i = 0; i < KV; ++i) states[i] = ld(saved, r.sv(b, h, c) + i);
        for (int64_t i = 0; i < n; ++i) {
          std::vector<double> S(states.begin() + i * KV, states.begin() + (i + 1) * KV);
          ref_step(a, r, b, t0 + i, h, S, e);
          std::copy(S.begin(), S.end(), states.begin() + (i + 1) * KV);
        }
        for (int64_t i = n - 1; i >= 0; --i) {
          const int64_t t = t0 + i, iq = r.qk(b, t, h), iv = r.vo(b, t, h);
          const double* Sp = &states[i * KV];
          const double* St = &states[(i + 1) * KV];
          const double beta = ld(a.beta, r.bt(b, t, h));
          for (int64_t d = 0; d < K; ++d) {
            qs[d] = a.scale * ld(a.q, iq + d);
            kk[d] = ld(a.k, iq + d);
            alpha[d] = std::exp(ld(a.g, iq + d));
            for (int64_t j = 0; j < V; ++j) Sa[d * V + j] = Sp[d * V + j] * alpha[d];
          }
          for (int64_t j = 0; j < V; ++j) {
            double p = 0;
            for (int64_t d = 0; d < K; ++d) p += Sa[d * V + j] * kk[d];
            e[j] = ld(a.v, iv + j) - p;
          }
          // o_t = S_t^T q: dS += q do^T, dq = S_t do.
          for (int64_t d = 0; d < K; ++d) {
            double dq = 0;
            for (int64_t j = 0; j < V; ++j) {
              const double dov = ld(d_o, iv + j);
              dS[d * V + j] += qs[d] * dov;
              dq += St[d * V + j] * dov;
            }
            st(gr.dq, iq + d, a.scale * dq);
          }
          // S_t = Sa + beta k e^T with e = v - Sa^T k.
          double dbeta = 0;
          for (int64_t d = 0; d < K; ++d) {
            double s = 0;
            for (int64_t j = 0; j < V; ++j) s += dS[d * V + j] * e[j];
            dSe[d] = s;
            dbeta += kk[d] * s;
          }
          for (int64_t j = 0; j < V; ++j) {
            double s = 0;
            for (int64_t d = 0; d < K; ++d) s += dS[d * V + j] * kk[d];
            de[j] = beta * s;
            st(gr.dv, iv + j, de[j]);
          }
          st(gr.dbeta, r.bt(b, t, h), dbeta);
          for (int64_t d = 0; d < K; ++d) {
            double dk = beta * dSe[d], dg = 0;
            for (int64_t j = 0; j < V; ++j) {
              dk -= Sa[d * V + j] * de[j];
              const double dSa = dS[d * V + j] - kk[d] * de[j];
              dg += Sa[d * V + j] * dSa;
              dS[d * V + j] = dSa * alpha[d];
            }
            st(gr.dk, iq + d, dk);
            st(gr.dg, iq + d, dg);
          }
        }
      }
      for (int64_t i = 0; i < KV; ++i) st(gr.dh0, r.st(b, h) + i, dS[i]);
    }
}

void kda_step_ref(const KdaArgs& a, Tensor& o, Tensor& new_state) {
  KdaSaved none;
  kda_ref(a, o, new_state, none);
}

// The gates, element by element in double.
struct GateRef {
  const KdaGateArgs& a;
  int64_t rows, P, per_head;
  explicit GateRef(const KdaGateArgs& args)
      : a(args), rows(args.z.size(0)), P(args.z.size(1)), per_head(P / args.a.numel()) {}
  double x(int64_t r, int64_t p) const {
    const double b = a.bias.defined() ? load_as_double(a.bias.data_ptr(), a.bias.dtype(), p) : 0;
    return load_as_double(a.z.data_ptr(), a.z.dtype(), r * P + p) + b;
  }
  double factor(int64_t p) const {
    return load_as_double(a.a.data_ptr(), a.a.dtype(), p / per_head);
  }
};
double sigmoid_d(double x) {
  return 1.0 / (1.0 + std::exp(-x));
}

void kda_gate_ref(const KdaGateArgs& args, Tensor& g) {
  const GateRef ref(args);
  for (int64_t r = 0; r < ref.rows; ++r)
    for (int64_t p = 0; p < ref.P; ++p) {
      const double x = ref.x(r, p), a = ref.factor(p);
      const double v = args.kind == KdaGateKind::Softplus
                           ? -a * (x > 20 ? x : std::log1p(std::exp(x)))
                           : args.g_min * sigmoid_d(a * x);
      store_from_double(g.data_ptr(), g.dtype(), r * ref.P + p, v);
    }
}

void kda_gate_backward_ref(const KdaGateArgs& args, const Tensor& dg, Tensor& dz, Tensor& dbias,
                           Tensor& da) {
  const GateRef ref(args);
  std::vector<double> db(ref.P, 0.0), dav(args.a.numel(), 0.0);
  for (int64_t r = 0; r < ref.rows; ++r)
    for (int64_t p = 0; p < ref.P; ++p) {
      const double x = ref.x(r, p), a = ref.factor(p);
      const double d = load_as_double(dg.data_ptr(), dg.dtype(), r * ref.P + p);
      double dx;
      if (args.kind == KdaGateKind::Softplus) {
        dx = -a * (x > 20 ? 1.0 : sigmoid_d(x)) * d;
        dav[p / ref.per_head] -= (x > 20 ? x : std::log1p(std::exp(x))) * d;
      } else {
        const double s = sigmoid_d(a * x), t = args.g_min * s * (1 - s) * d;
        dx = a * t;
        dav[p / ref.per_head] += x * t;
      }
      store_from_double(dz.data_ptr(), dz.dtype(), r * ref.P + p, dx);
      db[p] += dx;
    }
  if (dbias.defined())
    for (int64_t p = 0; p < ref.P; ++p)
      store_from_double(dbias.data_ptr(), dbias.dtype(), p, db[p]);
  for (size_t h = 0; h < dav.size(); ++h)
    store_from_double(da.data_ptr(), da.dtype(), static_cast<int64_t>(h), dav[h]);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(kda_gate_kernels, Backend::Reference, &kda_gate_ref);
MYRIAD_REGISTER_KERNEL(kda_gate_backward_kernels, Backend::Reference, &kda_gate_backward_ref);
MYRIAD_REGISTER_KERNEL(kda_kernels, Backend::Reference, &kda_ref);
MYRIAD_REGISTER_KERNEL(kda_backward_kernels, Backend::Reference, &kda_backward_ref);
MYRIAD_REGISTER_KERNEL(kda_step_kernels, Backend::Reference, &kda_step_ref);

}  // namespace myriad::ops
