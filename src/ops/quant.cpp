// Weight-only int8 and int4: quantization, dequantization, the products and their dispatch
// (ops/quant.h).
#include "ops/quant.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<QuantGemmKernel>& quant_gemm_kernels() {
  static KernelTable<QuantGemmKernel> t("quant_gemm");
  return t;
}
KernelTable<DequantizeKernel>& dequantize_kernels() {
  static KernelTable<DequantizeKernel> t("dequantize");
  return t;
}

int64_t QuantWeight::bytes() const {
  return q.numel() + scale.numel() * static_cast<int64_t>(sizeof(float));
}

QuantWeight quantize(const Tensor& w, int bits, int act_bits) {
  check_inputs("quantize", {&w});
  MYRIAD_CHECK(bits == 8 || bits == 4, "quantize: bits must be 8 or 4, got ", bits);
  MYRIAD_CHECK(act_bits == 0 || (act_bits == 8 && bits == 8),
               "quantize: activation bits must be 0 (f32) or, with 8-bit weights, 8; got ",
               act_bits, " with ", bits, "-bit weights");
  MYRIAD_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16,
               "quantize: expected an f32 or bf16 weight, got ", w.desc());
  check_dim("quantize", w, 2);
  if (!w.device().is_cpu()) return quantize(w.to(kCPU), bits, act_bits).to(w.device());
  const int64_t out = w.size(0), in = w.size(1), groups = in / kQuantGroup;
  MYRIAD_CHECK(in % kQuantGroup == 0, "quantize: the input dimension of ", w.desc(),
               " is not a multiple of ", kQuantGroup);
  const Tensor wf = w.detach().to(DType::F32).contiguous();
  QuantWeight r{Tensor::empty({out, in * bits / 8}, DType::U8),
                Tensor::empty({out, groups}, DType::F32), bits, act_bits};
  const float* W = wf.data<float>();
  auto* Q = r.q.data<uint8_t>();
  float* S = r.scale.data<float>();
  const float lo = bits == 8 ? -127.0f : -8.0f, hi = bits == 8 ? 127.0f : 7.0f;
  for (int64_t i = 0; i < out * groups; ++i) {
    const float* src = W + i * kQuantGroup;
    float amax = 0, ext = 0;  // the largest |w| and the (first) element that has it
    for (int64_t j = 0; j < kQuantGroup; ++j)
      if (std::fabs(src[j]) > amax || std::isnan(src[j]))  // (a NaN sticks: the check below)
        amax = std::isnan(amax) ? amax : std::fabs(src[j]), ext = src[j];
    MYRIAD_CHECK(std::isfinite(amax), "quantize: ", w.desc(), " has a non-finite value in row ",
                 i / groups);
    const float s = bits == 8 ? amax / 127.0f : ext / -8.0f;
    S[i] = s;
    float q[kQuantGroup];
    for (int64_t j = 0; j < kQuantGroup; ++j)
      q[j] = s == 0.0f ? 0.0f : std::clamp(std::nearbyint(src[j] / s), lo, hi);
    if (bits == 8) {
      for (int64_t j = 0; j < kQuantGroup; ++j)
        Q[i * kQuantGroup + j] = static_cast<uint8_t>(static_cast<int8_t>(q[j]));
    } else {
      uint8_t* o = Q + i * (kQuantGroup / 2);
      for (int64_t j = 0; j < kQuantGroup / 2; ++j)
        o[j] = static_cast<uint8_t>(static_cast<int>(q[j]) + 8) |
               static_cast<uint8_t>((static_cast<int>(q[j + kQuantGroup / 2]) + 8) << 4);
    }
  }
  return r;
}

namespace {
void check_weight(const char* op, const QuantWeight& w) {
  MYRIAD_CHECK(
      (w.bits == 8 || w.bits == 4) && (w.act_bits == 0 || (w.act_bits == 8 && w.bits == 8)) &&
          w.q.defined() && w.scale.defined() && w.q.dtype() == DType::U8 &&
          w.scale.dtype() == DType::F32 && w.q.dim() == 2 && w.scale.dim() == 2 &&
          w.q.is_contiguous() && w.scale.is_contiguous() && w.in() % kQuantGroup == 0 &&
          w.scale.size(0) == w.q.size(0) && w.scale.size(1) == w.in() / kQuantGroup,
      op, ": not a quantized weight (", w.bits, "-bit codes u8 [out, in · bits / 8], ",
      "scales f32 [out, in / ", kQuantGroup, "]): ", w.q.defined() ? w.q.desc() : "undefined", ", ",
      w.scale.defined() ? w.scale.desc() : "undefined");
}

void check_x(const char* op, const Tensor& x, const QuantWeight& w, int64_t rank) {
  check_inputs(op, {&x});
  MYRIAD_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, op,
               ": the input must be f32 or bf16, got ", x.desc());
  if (rank) check_dim(op, x, rank);
  MYRIAD_CHECK(x.dim() >= 1 && x.size(-1) == w.in(), op, ": input features differ (x ",
               shape_str(x.shape()), ", weight [", w.out(), ", ", w.in(), "])");
  MYRIAD_CHECK(x.device() == w.q.device(), op, ": x is on ", x.device().str(), ", the weight on ",
               w.q.device().str());
  MYRIAD_CHECK(!needs_grad({&x}), op,
               ": quantized weights are for inference; the input requires a gradient");
}

// The few-row product for rows [0, m) of x2 (contiguous f32 [m, in]) into y2 [m, out].
GemmArgs stream_args(const Tensor& x2, int64_t r0, int64_t r1, const QuantWeight& w, Tensor& y2) {
  GemmArgs a;
  a.m = r1 - r0, a.n = w.out(), a.k = w.in(), a.trans_b = true;
  a.a = x2.data<float>() + r0 * w.in();
  a.b = w.q.data_ptr();
  a.b_scale = w.scale.data<float>();
  a.b_bits = w.bits;
  a.a_bits = w.act_bits;
  a.c = y2.data<float>() + r0 * w.out();
  a.lda = w.in(), a.ldb = w.q.size(1), a.ldc = w.out();
  a.dtype = DType::F32, a.device = x2.device();
  return a;
}

bool streams(const Tensor& x, int64_t rows) {
  return rows <= kQuantStreamRows && quant_gemm_kernels().has(backend_for(x.device(), DType::F32));
}
}  // namespace

Tensor dequantize(const QuantWeight& w) {
  check_weight("dequantize", w);
  MYRIAD_CHECK(w.scale.device() == w.q.device(), "dequantize: codes on ", w.q.device().str(),
               ", scales on ", w.scale.device().str());
  Tensor r = Tensor::empty({w.out(), w.in()}, DType::F32, w.q.device());
  dequantize_kernels().get(w.q.device(), DType::F32)(w, r);
  return r;
}

Tensor linear_quant(const Tensor& x, const QuantWeight& w) {
  check_weight("linear_quant", w);
  check_x("linear_quant", x, w, 0);
  if (x.dtype() == DType::BF16) return linear_quant(x.to(DType::F32), w).to(DType::BF16);
  NoGradGuard ng;
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  so.push_back(w.out());
  if (!streams(x, rows)) return linear(x, dequantize(w));
  Tensor y = Tensor::empty(so, DType::F32, x.device());
  if (rows == 0) return y;
  const Tensor x2 = x.contiguous();
  quant_gemm_kernels().get(x.device(), DType::F32)({stream_args(x2, 0, rows, w, y)});
  return y;
}

Tensor grouped_linear_quant(const Tensor& x, const std::vector<int64_t>& offsets,
                            const std::vector<const QuantWeight*>& w) {
  const char* op = "grouped_linear_quant";
  MYRIAD_CHECK(!w.empty(), op, ": no groups");
  for (const QuantWeight* wg : w) {
    MYRIAD_CHECK(wg, op, ": a null weight");
    check_weight(op, *wg);
    MYRIAD_CHECK(wg->out() == w[0]->out() && wg->in() == w[0]->in() && wg->bits == w[0]->bits &&
                     wg->act_bits == w[0]->act_bits,
                 op, ": weight [", wg->out(), ", ", wg->in(), "] (", wg->bits,
                 " bits, activations ", wg->act_bits, ") differs from the first, [", w[0]->out(),
                 ", ", w[0]->in(), "] (", w[0]->bits, " bits, activations ", w[0]->act_bits, ")");
  }
  check_x(op, x, *w[0], 2);
  MYRIAD_CHECK(
      offsets.size() == w.size() + 1 && offsets.front() == 0 && offsets.back() == x.size(0), op,
      ": offsets must run from 0 to ", x.size(0), " in ", w.size() + 1, " entries, got ",
      offsets.size(), " entries");
  for (size_t g = 0; g < w.size(); ++g)
    MYRIAD_CHECK(offsets[g] <= offsets[g + 1], op, ": offsets decrease at group ", g);
  if (x.dtype() == DType::BF16)
    return grouped_linear_quant(x.to(DType::F32), offsets, w).to(DType::BF16);
  NoGradGuard ng;
  bool all_stream = true;
  for (size_t g = 0; g < w.size(); ++g)
    all_stream = all_stream && streams(x, offsets[g + 1] - offsets[g]);
  if (!all_stream) {
    // Prefill: every group's dequantized weight in one grouped_linear (one parallel region and
    // oneDNN primitives of any row count; a group of up to 16 rows gets the streamed bits there
    // too, the f32 few-row kernel on the dequantized weight). An empty group reads no weight: it
    // takes another group's.
    std::vector<Tensor> wf(w.size());
    for (size_t g = 0; g < w.size(); ++g)
      if (offsets[g + 1] > offsets[g]) wf[g] = dequantize(*w[g]);
    const Tensor any =
        *std::find_if(wf.begin(), wf.end(), [](const Tensor& t) { return t.defined(); });
    for (Tensor& t : wf)
      if (!t.defined()) t = any;
    return grouped_linear(x, offsets, wf);
  }
  const Tensor x2 = x.contiguous();
  Tensor y = Tensor::empty({x.size(0), w[0]->out()}, DType::F32, x.device());
  std::vector<GemmArgs> few;  // one unit of work: one parallel region for all of decode's experts
  for (size_t g = 0; g < w.size(); ++g) {
    const int64_t r0 = offsets[g], r1 = offsets[g + 1];
    if (r0 < r1) few.push_back(stream_args(x2, r0, r1, *w[g], y));
  }
  if (!few.empty()) quant_gemm_kernels().get(x.device(), DType::F32)(few);
  return y;
}

Tensor linear_quant_cat(const Tensor& x, const std::vector<const QuantWeight*>& w) {
  const char* op = "linear_quant_cat";
  MYRIAD_CHECK(!w.empty(), op, ": no weights");
  std::vector<int64_t> at;  // first output column of each product
  int64_t total = 0;
  for (const QuantWeight* wi : w) {
    MYRIAD_CHECK(wi, op, ": a null weight");
    check_weight(op, *wi);
    MYRIAD_CHECK(wi->bits == w[0]->bits && wi->act_bits == w[0]->act_bits, op, ": weights of ",
                 w[0]->bits, " and ", wi->bits, " bits (activations ", w[0]->act_bits, " and ",
                 wi->act_bits, " bits)");
    check_x(op, x, *wi, 0);
    at.push_back(total);
    total += wi->out();
  }
  if (x.dtype() == DType::BF16) return linear_quant_cat(x.to(DType::F32), w).to(DType::BF16);
  NoGradGuard ng;
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  if (!streams(x, rows)) {  // prefill: linear_cat on the dequantized weights
    std::vector<Tensor> wf;
    for (const QuantWeight* wi : w) wf.push_back(dequantize(*wi));
    return linear_cat(x, wf);
  }
  so.push_back(total);
  Tensor y = Tensor::empty(so, DType::F32, x.device());
  if (rows == 0) return y;
  const Tensor x2 = x.contiguous();
  std::vector<GemmArgs> few;
  for (size_t i = 0; i < w.size(); ++i) {
    GemmArgs a = stream_args(x2, 0, rows, *w[i], y);
    a.c = y.data<float>() + at[i];
    a.ldc = total;
    few.push_back(a);
  }
  quant_gemm_kernels().get(x.device(), DType::F32)(few);
  return y;
}

// ---- reference kernels (dequantize is also the CPU's: one pass of conversions) ----
namespace {
void dequantize_ref(const QuantWeight& w, Tensor& r) {
  const auto* Q = w.q.data<uint8_t>();
  const float* S = w.scale.data<float>();
  float* R = r.data<float>();
  // Group by group, so the inner loop is one scale times 32 codes (it vectorises).
  for (int64_t g = 0, groups = w.out() * w.in() / kQuantGroup; g < groups; ++g) {
    const float s = S[g];
    float* o = R + g * kQuantGroup;
    if (w.bits == 8) {
      const uint8_t* q = Q + g * kQuantGroup;
      for (int64_t j = 0; j < kQuantGroup; ++j)
        o[j] = static_cast<float>(static_cast<int8_t>(q[j])) * s;
    } else {
      const uint8_t* q = Q + g * (kQuantGroup / 2);
      for (int64_t j = 0; j < kQuantGroup / 2; ++j) {
        o[j] = static_cast<float>((q[j] & 15) - 8) * s;
        o[j + kQuantGroup / 2] = static_cast<float>((q[j] >> 4) - 8) * s;
      }
    }
  }
}

// Element e of row j of B as its code (int8, or int4 minus 8).
int code(const GemmArgs& g, int64_t j, int64_t e) {
  const auto* row = static_cast<const uint8_t*>(g.b) + j * g.ldb;
  if (g.b_bits == 8) return static_cast<int8_t>(row[e]);
  const uint8_t b = row[e / kQuantGroup * (kQuantGroup / 2) + e % (kQuantGroup / 2)];
  return (e % kQuantGroup < kQuantGroup / 2 ? b & 15 : b >> 4) - 8;
}

// One row of A quantized per group of 32 by the int8 rule (ops/quant.h): codes and group scales.
void quantize_row(const float* x, int64_t k, std::vector<int>& q, std::vector<float>& s) {
  q.assign(static_cast<size_t>(k), 0);
  s.assign(static_cast<size_t>(k / kQuantGroup), 0.0f);
  for (int64_t g = 0; g < k / kQuantGroup; ++g) {
    float amax = 0;
    for (int64_t e = g * kQuantGroup; e < (g + 1) * kQuantGroup; ++e)
      if (std::fabs(x[e]) > amax || std::isnan(x[e]))
        amax = std::isnan(amax) ? amax : std::fabs(x[e]);
    const float xs = amax / 127.0f;
    s[static_cast<size_t>(g)] = xs;
    if (xs == 0.0f || !std::isfinite(xs)) continue;  // codes 0 (a non-finite scale gives NaN)
    for (int64_t e = g * kQuantGroup; e < (g + 1) * kQuantGroup; ++e)
      q[static_cast<size_t>(e)] =
          static_cast<int>(std::clamp(std::nearbyint(x[e] / xs), -127.0f, 127.0f));
  }
}

void quant_gemm_ref(const std::vector<GemmArgs>& gs) {
  std::vector<int> xq;
  std::vector<float> xs;
  for (const GemmArgs& g : gs) {
    MYRIAD_CHECK(g.trans_b && g.dtype == DType::F32 && g.b_scale && g.k % kQuantGroup == 0 &&
                     (g.b_bits == 8 || g.b_bits == 4) && (g.a_bits == 0 || g.a_bits == 8) &&
                     g.batch == 1,
                 "quant_gemm: the reference takes f32 A against codes [n, k], got ", g.b_bits,
                 "-bit codes, ", g.a_bits, "-bit activations, batch ", g.batch);
    const int64_t groups = g.k / kQuantGroup;
    for (int64_t r = 0; r < g.m; ++r) {
      const float* x = static_cast<const float*>(g.a) + r * g.lda;
      if (g.a_bits == 8) quantize_row(x, g.k, xq, xs);
      for (int64_t j = 0; j < g.n; ++j) {
        const float* ws = g.b_scale + j * groups;
        float y = 0;
        if (g.a_bits == 0) {
          double sum = 0;
          for (int64_t e = 0; e < g.k; ++e)
            sum += static_cast<double>(x[e]) *
                   (static_cast<float>(code(g, j, e)) * ws[e / kQuantGroup]);
          y = static_cast<float>(sum);
        } else {
          float acc[16] = {};
          for (int64_t b = 0; b < (g.k + 63) / 64; ++b)
            for (int l = 0; l < 16; ++l) {
              const int64_t grp = 2 * b + l / 8, e0 = 64 * b + 4 * l;
              int p = 0;
              float sc = 0;
              if (grp < groups) {
                for (int64_t e = e0; e < e0 + 4; ++e)
                  p += xq[static_cast<size_t>(e)] * code(g, j, e);
                sc = xs[static_cast<size_t>(grp)] * ws[grp];
              }
              acc[l] = std::fma(static_cast<float>(p), sc, acc[l]);
            }
          for (float a : acc) y += a;
        }
        float* c = static_cast<float*>(g.c) + r * g.ldc + j;
        *c = g.beta == 0.0f ? g.alpha * y : g.alpha * y + g.beta * *c;
      }
    }
  }
}
}  // namespace
MYRIAD_REGISTER_KERNEL(quant_gemm_kernels, Backend::Reference, &quant_gemm_ref);
MYRIAD_REGISTER_KERNEL(dequantize_kernels, Backend::Reference, &dequantize_ref);
MYRIAD_REGISTER_KERNEL(dequantize_kernels, Backend::CPU, &dequantize_ref);

}  // namespace myriad::ops
