// Weight-only int8: quantization, dequantization, the products and their dispatch (ops/int8.h).
#include "ops/int8.h"

#include <algorithm>
#include <cmath>

#include "core/autograd.h"
#include "ops/check.h"
#include "ops/shape.h"

namespace myriad::ops {

KernelTable<Int8GemmKernel>& int8_gemm_kernels() {
  static KernelTable<Int8GemmKernel> t("int8_gemm");
  return t;
}

int64_t Int8Weight::bytes() const {
  return q.numel() + scale.numel() * static_cast<int64_t>(sizeof(float));
}

Int8Weight quantize_int8(const Tensor& w) {
  check_inputs("quantize_int8", {&w});
  MYRIAD_CHECK(w.dtype() == DType::F32 || w.dtype() == DType::BF16,
               "quantize_int8: expected an f32 or bf16 weight, got ", w.desc());
  check_dim("quantize_int8", w, 2);
  MYRIAD_CHECK(w.device().is_cpu(), "quantize_int8: the weight must be on the cpu, got ", w.desc());
  const int64_t out = w.size(0), in = w.size(1), groups = in / kInt8Group;
  MYRIAD_CHECK(in % kInt8Group == 0, "quantize_int8: the input dimension of ", w.desc(),
               " is not a multiple of ", kInt8Group);
  const Tensor wf = w.detach().to(DType::F32).contiguous();
  Int8Weight r{Tensor::empty({out, in}, DType::U8), Tensor::empty({out, groups}, DType::F32)};
  const float* W = wf.data<float>();
  auto* Q = r.q.data<uint8_t>();
  float* S = r.scale.data<float>();
  for (int64_t i = 0; i < out * groups; ++i) {
    const float* src = W + i * kInt8Group;
    float amax = 0;
    for (int64_t j = 0; j < kInt8Group; ++j) amax = std::max(amax, std::fabs(src[j]));
    MYRIAD_CHECK(std::isfinite(amax), "quantize_int8: ", w.desc(),
                 " has a non-finite value in row ", i / groups);
    const float s = amax / 127.0f;
    S[i] = s;
    for (int64_t j = 0; j < kInt8Group; ++j) {
      const float v = s == 0.0f ? 0.0f : std::clamp(std::nearbyint(src[j] / s), -127.0f, 127.0f);
      Q[i * kInt8Group + j] = static_cast<uint8_t>(static_cast<int8_t>(v));
    }
  }
  return r;
}

namespace {
void check_weight(const char* op, const Int8Weight& w) {
  MYRIAD_CHECK(w.q.defined() && w.scale.defined() && w.q.dtype() == DType::U8 &&
                   w.scale.dtype() == DType::F32 && w.q.dim() == 2 && w.scale.dim() == 2 &&
                   w.q.is_contiguous() && w.scale.is_contiguous() &&
                   w.q.size(1) % kInt8Group == 0 && w.scale.size(0) == w.q.size(0) &&
                   w.scale.size(1) == w.q.size(1) / kInt8Group,
               op, ": not an int8 weight (codes u8 [out, in], scales f32 [out, in / ", kInt8Group,
               "]): ", w.q.defined() ? w.q.desc() : "undefined", ", ",
               w.scale.defined() ? w.scale.desc() : "undefined");
}

void check_x(const char* op, const Tensor& x, const Int8Weight& w, int64_t rank) {
  check_inputs(op, {&x});
  MYRIAD_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16, op,
               ": the input must be f32 or bf16, got ", x.desc());
  if (rank) check_dim(op, x, rank);
  MYRIAD_CHECK(x.dim() >= 1 && x.size(-1) == w.in(), op, ": input features differ (x ",
               shape_str(x.shape()), ", weight [", w.out(), ", ", w.in(), "])");
  MYRIAD_CHECK(x.device() == w.q.device(), op, ": x is on ", x.device().str(), ", the weight on ",
               w.q.device().str());
  MYRIAD_CHECK(!needs_grad({&x}), op,
               ": int8 weights are for inference; the input requires a gradient");
}

// The few-row product for rows [0, m) of x2 (contiguous f32 [m, in]) into y2 [m, out].
GemmArgs stream_args(const Tensor& x2, int64_t r0, int64_t r1, const Int8Weight& w, Tensor& y2) {
  GemmArgs a;
  a.m = r1 - r0, a.n = w.out(), a.k = w.in(), a.trans_b = true;
  a.a = x2.data<float>() + r0 * w.in();
  a.b = w.q.data_ptr();
  a.b_scale = w.scale.data<float>();
  a.c = y2.data<float>() + r0 * w.out();
  a.lda = a.ldb = w.in(), a.ldc = w.out();
  a.dtype = DType::F32, a.device = x2.device();
  return a;
}

bool streams(const Tensor& x, int64_t rows) {
  return rows <= kInt8StreamRows && int8_gemm_kernels().has(backend_for(x.device(), DType::F32));
}
}  // namespace

Tensor dequantize_int8(const Int8Weight& w) {
  check_weight("dequantize_int8", w);
  MYRIAD_CHECK(w.q.device().is_cpu(), "dequantize_int8: the weight must be on the cpu");
  Tensor r = Tensor::empty({w.out(), w.in()}, DType::F32);
  const auto* Q = w.q.data<uint8_t>();
  const float* S = w.scale.data<float>();
  float* R = r.data<float>();
  // Group by group, so the inner loop is one scale times 32 codes (it vectorises).
  for (int64_t g = 0, groups = w.out() * w.in() / kInt8Group; g < groups; ++g) {
    const float s = S[g];
    const uint8_t* q = Q + g * kInt8Group;
    float* o = R + g * kInt8Group;
    for (int64_t j = 0; j < kInt8Group; ++j)
      o[j] = static_cast<float>(static_cast<int8_t>(q[j])) * s;
  }
  return r;
}

Tensor linear_int8(const Tensor& x, const Int8Weight& w) {
  check_weight("linear_int8", w);
  check_x("linear_int8", x, w, 0);
  if (x.dtype() == DType::BF16) return linear_int8(x.to(DType::F32), w).to(DType::BF16);
  NoGradGuard ng;
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  so.push_back(w.out());
  if (!streams(x, rows)) return linear(x, dequantize_int8(w));
  Tensor y = Tensor::empty(so, DType::F32, x.device());
  if (rows == 0) return y;
  const Tensor x2 = x.contiguous();
  int8_gemm_kernels().get(x.device(), DType::F32)({stream_args(x2, 0, rows, w, y)});
  return y;
}

Tensor grouped_linear_int8(const Tensor& x, const std::vector<int64_t>& offsets,
                           const std::vector<const Int8Weight*>& w) {
  const char* op = "grouped_linear_int8";
  MYRIAD_CHECK(!w.empty(), op, ": no groups");
  for (const Int8Weight* wg : w) {
    MYRIAD_CHECK(wg, op, ": a null weight");
    check_weight(op, *wg);
    MYRIAD_CHECK(wg->out() == w[0]->out() && wg->in() == w[0]->in(), op, ": weight [", wg->out(),
                 ", ", wg->in(), "] differs from the first, [", w[0]->out(), ", ", w[0]->in(), "]");
  }
  check_x(op, x, *w[0], 2);
  MYRIAD_CHECK(
      offsets.size() == w.size() + 1 && offsets.front() == 0 && offsets.back() == x.size(0), op,
      ": offsets must run from 0 to ", x.size(0), " in ", w.size() + 1, " entries, got ",
      offsets.size(), " entries");
  for (size_t g = 0; g < w.size(); ++g)
    MYRIAD_CHECK(offsets[g] <= offsets[g + 1], op, ": offsets decrease at group ", g);
  if (x.dtype() == DType::BF16)
    return grouped_linear_int8(x.to(DType::F32), offsets, w).to(DType::BF16);
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
      if (offsets[g + 1] > offsets[g]) wf[g] = dequantize_int8(*w[g]);
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
  if (!few.empty()) int8_gemm_kernels().get(x.device(), DType::F32)(few);
  return y;
}

Tensor linear_int8_cat(const Tensor& x, const std::vector<const Int8Weight*>& w) {
  const char* op = "linear_int8_cat";
  MYRIAD_CHECK(!w.empty(), op, ": no weights");
  std::vector<int64_t> at;  // first output column of each product
  int64_t total = 0;
  for (const Int8Weight* wi : w) {
    MYRIAD_CHECK(wi, op, ": a null weight");
    check_weight(op, *wi);
    check_x(op, x, *wi, 0);
    at.push_back(total);
    total += wi->out();
  }
  if (x.dtype() == DType::BF16) return linear_int8_cat(x.to(DType::F32), w).to(DType::BF16);
  NoGradGuard ng;
  Shape so(x.shape().begin(), x.shape().end() - 1);
  const int64_t rows = shape_numel(so);
  if (!streams(x, rows)) {  // prefill: linear_cat on the dequantized weights
    std::vector<Tensor> wf;
    for (const Int8Weight* wi : w) wf.push_back(dequantize_int8(*wi));
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
  int8_gemm_kernels().get(x.device(), DType::F32)(few);
  return y;
}

}  // namespace myriad::ops
