// Attention: checks, autograd through the fused backward kernel, and the plain reference kernels
// (one full score row per query, in double).
#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<AttentionKernel>& attention_kernels() {
  static KernelTable<AttentionKernel> t("attention");
  return t;
}
KernelTable<AttentionBackwardKernel>& attention_backward_kernels() {
  static KernelTable<AttentionBackwardKernel> t("attention_backward");
  return t;
}
KernelTable<PagedAttentionKernel>& paged_attention_kernels() {
  static KernelTable<PagedAttentionKernel> t("paged_attention");
  return t;
}

namespace {
// t itself when its last dimension is unit-stride (or of size <= 1), else a contiguous copy.
Tensor unit_last(const Tensor& t) {
  return t.shape().back() <= 1 || t.strides().back() == 1 ? t : t.contiguous();
}
}  // namespace

Tensor attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in, double scale,
                 bool causal, int64_t q_offset, const Tensor& key_bias, int64_t bias_window) {
  const char* name = "attention";
  const bool has_bias = key_bias.defined();
  Device dev = has_bias ? check_inputs(name, {&q_in, &k_in, &v_in, &key_bias})
                        : check_inputs(name, {&q_in, &k_in, &v_in});
  check_floating(name, q_in);
  check_same_dtype(name, {&q_in, &k_in, &v_in});
  MYRIAD_CHECK(q_in.dim() == 4 && k_in.dim() == 4 && v_in.dim() == 4, name,
               ": expected q [B, Hq, Tq, Dk], k [B, Hkv, Tk, Dk], v [B, Hkv, Tk, Dv], got ",
               descs({&q_in, &k_in, &v_in}));
  const Shape &qs = q_in.shape(), &ks = k_in.shape(), &vs = v_in.shape();
  MYRIAD_CHECK(ks[0] == qs[0] && vs[0] == qs[0] && vs[1] == ks[1] && vs[2] == ks[2] &&
                   ks[3] == qs[3] && ks[1] >= 1 && qs[1] % ks[1] == 0,
               name,
               ": shapes do not fit q [B, Hq, Tq, Dk], k [B, Hkv, Tk, Dk], v [B, Hkv, Tk, Dv] "
               "with Hq a multiple of Hkv: got ",
               descs({&q_in, &k_in, &v_in}));
  MYRIAD_CHECK(std::isfinite(scale), name, ": scale must be finite, got ", scale);
  if (has_bias) {
    MYRIAD_CHECK(key_bias.dtype() == q_in.dtype() || key_bias.dtype() == DType::F32, name,
                 ": key_bias must be f32 or q's dtype, got ", descs({&q_in, &key_bias}));
    MYRIAD_CHECK(
        key_bias.dim() == 2 && key_bias.shape()[0] == qs[0] && key_bias.shape()[1] == ks[2], name,
        ": key_bias must be [B, Tk] = [", qs[0], ", ", ks[2], "], got ", key_bias.desc());
  }
  const AttentionParams p{scale, causal, q_offset, bias_window};
  const Tensor q = unit_last(q_in), k = unit_last(k_in), v = unit_last(v_in);
  const Tensor bias = has_bias ? key_bias.contiguous() : Tensor();
  const DType t = q.dtype();
  Tensor out = Tensor::empty({qs[0], qs[1], qs[2], vs[3]}, t, dev);
  Tensor lse = Tensor::empty({qs[0], qs[1], qs[2]}, t == DType::F64 ? DType::F64 : DType::F32, dev);
  attention_kernels().get(dev, t)(p, q, k, v, bias, out, lse);
  if (needs_grad({&q_in, &k_in, &v_in, &key_bias})) {
    record(name, out, {q_in, k_in, v_in, key_bias},
           [p, q = q.detach(), k = k.detach(), v = v.detach(),
            bias = has_bias ? bias.detach() : Tensor(), out = out.detach(),
            lse](const Tensor& g) -> std::vector<Tensor> {
             const Tensor dout = g.to(out.dtype()).contiguous();
             Tensor dq = Tensor::empty(q.shape(), q.dtype(), q.device());
             Tensor dk = Tensor::empty(k.shape(), k.dtype(), k.device());
             Tensor dv = Tensor::empty(v.shape(), v.dtype(), v.device());
             Tensor db = bias.defined() ? Tensor::empty(bias.shape(), bias.dtype(), bias.device())
                                        : Tensor();
             attention_backward_kernels().get(q.device(), q.dtype())(p, q, k, v, bias, out, lse,
                                                                     dout, dq, dk, dv, db);
             return {dq, dk, dv, db};
           });
  }
  return out;
}

Tensor paged_attention(const Tensor& q_in, const std::vector<std::vector<Tensor>>& pages,
                       const std::vector<int64_t>& lengths, int64_t dv, double scale) {
  const char* name = "paged_attention";
  const Device dev = check_inputs(name, {&q_in});
  check_floating(name, q_in);
  check_dim(name, q_in, 4);
  const int64_t B = q_in.size(0), Tq = q_in.size(2), Dk = q_in.size(3);
  MYRIAD_CHECK(!needs_grad({&q_in}), name, ": paged caches are for inference (no autograd)");
  MYRIAD_CHECK(static_cast<int64_t>(pages.size()) == B && static_cast<int64_t>(lengths.size()) == B,
               name, ": ", B, " sequences in q, ", pages.size(), " page tables and ",
               lengths.size(), " lengths");
  MYRIAD_CHECK(std::isfinite(scale), name, ": scale must be finite, got ", scale);
  const Tensor* first = nullptr;  // the first page: every page has its shape and dtype
  for (const auto& table : pages)
    if (!table.empty()) {
      first = &table[0];
      break;
    }
  MYRIAD_CHECK(first, name, ": no pages");
  MYRIAD_CHECK(first->dim() == 2 && first->size(1) >= Dk && first->size(1) >= dv && dv >= 1, name,
               ": a page [block_tokens, C] must have C >= Dk = ", Dk, " and >= dv = ", dv, ", got ",
               first->desc());
  const int64_t bt = first->size(0), C = first->size(1);
  for (int64_t b = 0; b < B; ++b) {
    MYRIAD_CHECK(lengths[b] >= Tq && lengths[b] <= static_cast<int64_t>(pages[b].size()) * bt, name,
                 ": sequence ", b, " holds ", lengths[b], " keys in ", pages[b].size(),
                 " pages of ", bt, "; it needs at least its ", Tq, " queries");
    for (const Tensor& pg : pages[b]) {
      check_inputs(name, {&pg});
      MYRIAD_CHECK(pg.shape() == first->shape() && pg.dtype() == q_in.dtype() &&
                       pg.device() == dev && pg.is_contiguous(),
                   name, ": pages must all be contiguous ", first->desc(), " like q (", q_in.desc(),
                   "), got ", pg.desc());
    }
  }
  const Tensor q = unit_last(q_in);
  const AttentionParams p{scale, true, 0, 0};
  const Backend be = backend_for(dev, q.dtype());
  if (!paged_attention_kernels().has(be)) {  // the definition: attention over the gathered keys
    std::vector<Tensor> rows;
    for (int64_t b = 0; b < B; ++b) {
      std::vector<Tensor> parts;
      for (int64_t k = 0; k * bt < lengths[b]; ++k)
        parts.push_back(slice(pages[b][k], 0, 0, std::min(bt, lengths[b] - k * bt)));
      const Tensor keys = unsqueeze(unsqueeze(concat(parts, 0), 0), 0);  // [1, 1, S, C]
      rows.push_back(attention(slice(q, 0, b, b + 1), slice(keys, -1, 0, Dk),
                               slice(keys, -1, 0, dv), scale, true, lengths[b] - Tq));
    }
    return concat(rows, 0);
  }
  PagedKv kv;
  kv.block_tokens = bt, kv.row_stride = C, kv.dv = dv, kv.length = lengths;
  for (int64_t b = 0; b < B; ++b) {
    kv.first.push_back(static_cast<int64_t>(kv.page.size()));
    for (int64_t k = 0; k * bt < lengths[b]; ++k) kv.page.push_back(pages[b][k].data_ptr());
  }
  kv.first.push_back(static_cast<int64_t>(kv.page.size()));
  const DType t = q.dtype();
  Tensor out = Tensor::empty({B, q.size(1), Tq, dv}, t, dev);
  Tensor lse = Tensor::empty({B, q.size(1), Tq}, t == DType::F64 ? DType::F64 : DType::F32, dev);
  paged_attention_kernels().get(be)(p, q, kv, out, lse);
  return out;
}

// ---- reference kernels: plain loops in double ----
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Element (b, h, t, d) of a 4-d view.
double at4(const Tensor& x, int64_t b, int64_t h, int64_t t, int64_t d) {
  const Shape& s = x.strides();
  return load_as_double(x.data_ptr(), x.dtype(), b * s[0] + h * s[1] + t * s[2] + d * s[3]);
}

// The masked, biased score row of query (b, h, i): -inf where the key is not visible.
std::vector<double> score_row(const AttentionParams& p, const Tensor& q, const Tensor& k,
                              const Tensor& bias, int64_t b, int64_t h, int64_t i) {
  const int64_t G = q.shape()[1] / k.shape()[1], Tk = k.shape()[2], Dk = q.shape()[3];
  const int64_t qpos = p.q_offset + i;
  std::vector<double> s(Tk, kNegInf);
  for (int64_t j = 0; j < Tk; ++j) {
    if (!attention_visible(p, qpos, j)) continue;
    double dot = 0;
    for (int64_t d = 0; d < Dk; ++d) dot += at4(q, b, h, i, d) * at4(k, b, h / G, j, d);
    s[j] = p.scale * dot;
    if (bias.defined() && attention_biased(p, qpos, j))
      s[j] += load_as_double(bias.data_ptr(), bias.dtype(), b * Tk + j);
  }
  return s;
}

// Softmax of a score row in place; returns its logsumexp (-inf, with all zeros, when no key is
// visible).
double softmax_row(std::vector<double>& s) {
  double m = kNegInf;
  for (double x : s) m = std::max(m, x);
  if (m == kNegInf) {
    std::fill(s.begin(), s.end(), 0.0);
    return kNegInf;
  }
  double z = 0;
  for (double& x : s) z += x = std::exp(x - m);
  for (double& x : s) x /= z;
  return m + std::log(z);
}

void attention_ref(const AttentionParams& p, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& bias, Tensor& out, Tensor& lse) {
  const int64_t B = q.shape()[0], Hq = q.shape()[1], Tq = q.shape()[2];
  const int64_t G = Hq / k.shape()[1], Tk = k.shape()[2], Dv = v.shape()[3];
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> s = score_row(p, q, k, bias, b, h, i);
        const int64_t row = (b * Hq + h) * Tq + i;
        store_from_double(lse.data_ptr(), lse.dtype(), row, softmax_row(s));
        for (int64_t d = 0; d < Dv; ++d) {
          double o = 0;
          for (int64_t j = 0; j < Tk; ++j)
            if (s[j] != 0) o += s[j] * at4(v, b, h / G, j, d);
          store_from_double(out.data_ptr(), out.dtype(), row * Dv + d, o);
        }
      }
}

// With P the softmax row, dP_j = dout·v_j and dS_j = P_j (dP_j − Σ_l P_l dP_l):
// dq = scale Σ_j dS_j k_j, dk_j += scale dS_j q, dv_j += P_j dout, dbias_j += dS_j where biased.
void attention_backward_ref(const AttentionParams& p, const Tensor& q, const Tensor& k,
                            const Tensor& v, const Tensor& bias, const Tensor& out,
                            const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                            Tensor& dv, Tensor& dbias) {
  const int64_t B = q.shape()[0], Hq = q.shape()[1], Tq = q.shape()[2], Dk = q.shape()[3];
  const int64_t Hkv = k.shape()[1], G = Hq / Hkv, Tk = k.shape()[2], Dv = v.shape()[3];
  std::vector<double> gk(k.numel(), 0.0), gv(v.numel(), 0.0), gb(B * Tk, 0.0), gq(Dk);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < Hq; ++h)
      for (int64_t i = 0; i < Tq; ++i) {
        std::vector<double> P = score_row(p, q, k, bias, b, h, i);
        softmax_row(P);
        const int64_t row = (b * Hq + h) * Tq + i, kv = (b * Hkv + h / G) * Tk;
        auto dO = [&](int64_t d) {
          return load_as_double(dout.data_ptr(), dout.dtype(), row * Dv + d);
        };
        std::vector<double> dP(Tk, 0.0);
        double delta = 0;
        for (int64_t j = 0; j < Tk; ++j) {
          if (P[j] == 0) continue;
          for (int64_t d = 0; d < Dv; ++d) dP[j] += dO(d) * at4(v, b, h / G, j, d);
          delta += P[j] * dP[j];
        }
        std::fill(gq.begin(), gq.end(), 0.0);
        for (int64_t j = 0; j < Tk; ++j) {
          if (P[j] == 0) continue;
          const double dS = P[j] * (dP[j] - delta);
          for (int64_t d = 0; d < Dk; ++d) {
            gq[d] += p.scale * dS * at4(k, b, h / G, j, d);
            gk[(kv + j) * Dk + d] += p.scale * dS * at4(q, b, h, i, d);
          }
          for (int64_t d = 0; d < Dv; ++d) gv[(kv + j) * Dv + d] += P[j] * dO(d);
          if (bias.defined() && attention_biased(p, p.q_offset + i, j)) gb[b * Tk + j] += dS;
        }
        for (int64_t d = 0; d < Dk; ++d)
          store_from_double(dq.data_ptr(), dq.dtype(), row * Dk + d, gq[d]);
      }
  for (size_t x = 0; x < gk.size(); ++x) store_from_double(dk.data_ptr(), dk.dtype(), x, gk[x]);
  for (size_t x = 0; x < gv.size(); ++x) store_from_double(dv.data_ptr(), dv.dtype(), x, gv[x]);
  if (dbias.defined())
    for (size_t x = 0; x < gb.size(); ++x)
      store_from_double(dbias.data_ptr(), dbias.dtype(), x, gb[x]);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(attention_kernels, Backend::Reference, &attention_ref);
MYRIAD_REGISTER_KERNEL(attention_backward_kernels, Backend::Reference, &attention_backward_ref);

}  // namespace myriad::ops
