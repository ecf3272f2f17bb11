// Optimised CPU element-wise kernels: f32 and bf16 (computed in f32), vectorised through
// runtime-dispatched clones, threaded with OpenMP. Broadcasting is handled row by row: the last
// dimension of each operand is either contiguous or broadcast (stride 0); other layouts take
// the strided path.
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "core/strided.h"
#include "ops/elementwise.h"

namespace myriad::cpu {
namespace {
using ops::BinaryOp;
using ops::UnaryOp;

// Loads the n values of a bf16 row at p (stride 1) into the f32 buffer dst, or (stride 0) its
// one value into dst[0]: the row kernels take a broadcast operand with stride 0.
inline void load_bf16_row(const void* p, int64_t stride, int64_t n, float* dst) {
  const uint16_t* s = static_cast<const uint16_t*>(p);
  if (stride == 1)
    bf16_row_to_f32(s, dst, n);  // vectorised per CPU clone
  else
    dst[0] = bf16_load(s[0]);
}

template <BinaryOp OP>
inline float bin(float a, float b) {
  return ops::apply_binary<float>(OP, a, b);
}

// out[i] = a[i*sa] op b[i*sb] for sa, sb in {0, 1}.
template <BinaryOp OP>
MYRIAD_CPU_CLONES void binary_row_f32(const float* a, int64_t sa, const float* b, int64_t sb,
                                      float* out, int64_t n) {
  if (sa == 1 && sb == 1) {
    for (int64_t i = 0; i < n; ++i) out[i] = bin<OP>(a[i], b[i]);
  } else if (sa == 1) {
    float bv = b[0];
    for (int64_t i = 0; i < n; ++i) out[i] = bin<OP>(a[i], bv);
  } else if (sb == 1) {
    float av = a[0];
    for (int64_t i = 0; i < n; ++i) out[i] = bin<OP>(av, b[i]);
  } else {
    float v = bin<OP>(a[0], b[0]);
    for (int64_t i = 0; i < n; ++i) out[i] = v;
  }
}

using RowFn = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t);
RowFn binary_row(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return &binary_row_f32<BinaryOp::Add>;
    case BinaryOp::Sub:
      return &binary_row_f32<BinaryOp::Sub>;
    case BinaryOp::Mul:
      return &binary_row_f32<BinaryOp::Mul>;
    case BinaryOp::Div:
      return &binary_row_f32<BinaryOp::Div>;
    case BinaryOp::Max:
      return &binary_row_f32<BinaryOp::Max>;
    case BinaryOp::Min:
      return &binary_row_f32<BinaryOp::Min>;
    case BinaryOp::Ge:
      return &binary_row_f32<BinaryOp::Ge>;
    case BinaryOp::Le:
      return &binary_row_f32<BinaryOp::Le>;
  }
  return nullptr;
}

void check_float(const char* op, DType t) {
  MYRIAD_CHECK(t == DType::F32 || t == DType::BF16, op,
               ": the cpu kernel supports f32 and bf16, not ", dtype_name(t));
}

void binary_cpu(BinaryOp op, const Tensor& a, const Tensor& b, Tensor& out) {
  check_float(ops::op_name(op), out.dtype());
  const int64_t rank = out.dim();
  const int64_t n = rank ? out.shape()[rank - 1] : 1;
  const int64_t sa = rank ? a.strides()[rank - 1] : 0, sb = rank ? b.strides()[rank - 1] : 0;
  RowFn row = binary_row(op);
  const size_t es = dtype_size(out.dtype());
  const char* pa = static_cast<const char*>(a.data_ptr());
  const char* pb = static_cast<const char*>(b.data_ptr());
  char* po = static_cast<char*>(out.data_ptr());
  bool f32 = out.dtype() == DType::F32;
  if ((sa != 0 && sa != 1) || (sb != 0 && sb != 1)) {  // odd layouts: element by element
    for_each_offset<2>(out.shape(), {&a.strides(), &b.strides()},
                       [&, i = int64_t{0}](auto o) mutable {
                         float x = f32 ? reinterpret_cast<const float*>(pa)[o[0]]
                                       : bf16_load(reinterpret_cast<const uint16_t*>(pa)[o[0]]);
                         float y = f32 ? reinterpret_cast<const float*>(pb)[o[1]]
                                       : bf16_load(reinterpret_cast<const uint16_t*>(pb)[o[1]]);
                         float r = ops::apply_binary(op, x, y);
                         if (f32)
                           reinterpret_cast<float*>(po)[i++] = r;
                         else
                           reinterpret_cast<uint16_t*>(po)[i++] = bf16_store(r);
                       });
    return;
  }
  // Whole tensor as one row when everything is flat-contiguous or a is broadcast as a scalar.
  const int64_t rows = n ? out.numel() / n : 0;
  bool flat = a.is_contiguous() && b.is_contiguous() && a.shape() == out.shape() &&
              b.shape() == out.shape();
  // Row offsets of a and b (outer dimensions), computed once.
  std::vector<int64_t> oa, ob;
  if (!flat) {
    Shape outer(out.shape().begin(), out.shape().end() - (rank ? 1 : 0));
    Shape sa_o(a.strides().begin(), a.strides().end() - (rank ? 1 : 0));
    Shape sb_o(b.strides().begin(), b.strides().end() - (rank ? 1 : 0));
    oa.reserve(rows);
    ob.reserve(rows);
    for_each_offset<2>(outer, {&sa_o, &sb_o}, [&](auto o) {
      oa.push_back(o[0]);
      ob.push_back(o[1]);
    });
  }
  const int64_t total = out.numel();
  const int64_t grain = 1 << 15;
  auto run = [&](int64_t r0, int64_t r1, int64_t c0, int64_t c1) {
    // rows [r0, r1) of full width when flat is false; else the flat range [c0, c1).
    float bufa[1024], bufb[1024], bufo[1024];
    auto do_span = [&](int64_t a_off, int64_t sa_, int64_t b_off, int64_t sb_, int64_t o_off,
                       int64_t len) {
      if (f32) {
        row(reinterpret_cast<const float*>(pa) + a_off, sa_,
            reinterpret_cast<const float*>(pb) + b_off, sb_, reinterpret_cast<float*>(po) + o_off,
            len);
        return;
      }
      for (int64_t s = 0; s < len; s += 1024) {
        int64_t m = std::min<int64_t>(1024, len - s);
        load_bf16_row(pa + (a_off + s * sa_) * es, sa_, m, bufa);
        load_bf16_row(pb + (b_off + s * sb_) * es, sb_, m, bufb);
        row(bufa, sa_, bufb, sb_, bufo, m);
        f32_row_to_bf16(bufo, reinterpret_cast<uint16_t*>(po) + o_off + s, m);
      }
    };
    if (flat)
      do_span(c0, 1, c0, 1, c0, c1 - c0);
    else
      for (int64_t r = r0; r < r1; ++r) do_span(oa[r], sa, ob[r], sb, r * n, n);
  };
  if (flat)
    parallel_for(total, grain, [&](int64_t b, int64_t e) { run(0, 0, b, e); });
  else
    parallel_for(rows, std::max<int64_t>(1, grain / std::max<int64_t>(n, 1)),
                 [&](int64_t b, int64_t e) { run(b, e, 0, 0); });
}

void scalar_cpu(BinaryOp op, const Tensor& a, double s, bool reversed, Tensor& out) {
  check_float(ops::op_name(op), out.dtype());
  float sv = static_cast<float>(s);
  RowFn row = binary_row(op);
  int64_t n = a.numel();
  bool f32 = a.dtype() == DType::F32;
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    float bufa[1024], bufo[1024];
    for (int64_t s0 = b; s0 < e; s0 += 1024) {
      int64_t m = std::min<int64_t>(1024, e - s0);
      const float* in;
      float* o;
      if (f32) {
        in = a.data<float>() + s0;
        o = out.data<float>() + s0;
      } else {
        bf16_row_to_f32(a.data<uint16_t>() + s0, bufa, m);
        in = bufa;
        o = bufo;
      }
      if (reversed)
        row(&sv, 0, in, 1, o, m);
      else
        row(in, 1, &sv, 0, o, m);
      if (!f32) f32_row_to_bf16(bufo, out.data<uint16_t>() + s0, m);
    }
  });
}

template <UnaryOp OP>
inline float un(float x) {
  if constexpr (OP == UnaryOp::Exp) return fast_exp(x);
  if constexpr (OP == UnaryOp::Sigmoid) return 1.0f / (1.0f + fast_exp(-x));
  if constexpr (OP == UnaryOp::Silu) return x / (1.0f + fast_exp(-x));
  if constexpr (OP == UnaryOp::Tanh) return 1.0f - 2.0f / (1.0f + fast_exp(2.0f * x));
  if constexpr (OP == UnaryOp::Softplus) return fast_softplus(x);
  return ops::apply_unary<float>(OP, x);
}
template <UnaryOp OP>
inline float dun(float x, float y) {
  if constexpr (OP == UnaryOp::Silu) {
    float s = 1.0f / (1.0f + fast_exp(-x));
    return s * (1.0f + x * (1.0f - s));
  }
  if constexpr (OP == UnaryOp::Softplus) return x > 20.0f ? 1.0f : 1.0f / (1.0f + fast_exp(-x));
  return ops::unary_derivative<float>(OP, x, y);
}

template <UnaryOp OP>
MYRIAD_CPU_CLONES void unary_row(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = un<OP>(x[i]);
}
template <UnaryOp OP>
MYRIAD_CPU_CLONES void unary_bwd_row(const float* x, const float* y, const float* gy, float* gx,
                                     int64_t n) {
  for (int64_t i = 0; i < n; ++i) gx[i] = gy[i] * dun<OP>(x[i], y[i]);
}

using UnaryRow = void (*)(const float*, float*, int64_t);
using UnaryBwdRow = void (*)(const float*, const float*, const float*, float*, int64_t);
template <UnaryOp... OPS>
struct UnaryTable {
  static UnaryRow fwd(UnaryOp op) {
    UnaryRow r = nullptr;
    ((op == OPS ? (r = &unary_row<OPS>, 0) : 0), ...);
    return r;
  }
  static UnaryBwdRow bwd(UnaryOp op) {
    UnaryBwdRow r = nullptr;
    ((op == OPS ? (r = &unary_bwd_row<OPS>, 0) : 0), ...);
    return r;
  }
};
using AllUnary = UnaryTable<UnaryOp::Neg, UnaryOp::Exp, UnaryOp::Log, UnaryOp::Sqrt, UnaryOp::Rsqrt,
                            UnaryOp::Square, UnaryOp::Abs, UnaryOp::Sigmoid, UnaryOp::Silu,
                            UnaryOp::Tanh, UnaryOp::Softplus, UnaryOp::Relu>;

// Runs f over f32 spans of up to 1024 values of each operand, converting bf16 in and out.
template <size_t NIN, class F>
void map_spans(std::array<const Tensor*, NIN> in, Tensor& out, F&& f) {
  int64_t n = out.numel();
  bool f32 = out.dtype() == DType::F32;
  parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
    float buf[NIN + 1][1024];
    for (int64_t s = b; s < e; s += 1024) {
      int64_t m = std::min<int64_t>(1024, e - s);
      std::array<const float*, NIN> ptrs;
      float* o;
      for (size_t k = 0; k < NIN; ++k) {
        if (f32) {
          ptrs[k] = in[k]->template data<float>() + s;
        } else {
          bf16_row_to_f32(in[k]->template data<uint16_t>() + s, buf[k], m);
          ptrs[k] = buf[k];
        }
      }
      o = f32 ? out.data<float>() + s : buf[NIN];
      f(ptrs, o, m);
      if (!f32) f32_row_to_bf16(buf[NIN], out.data<uint16_t>() + s, m);
    }
  });
}

void unary_cpu(UnaryOp op, const Tensor& x, Tensor& out) {
  check_float(ops::op_name(op), x.dtype());
  UnaryRow row = AllUnary::fwd(op);
  map_spans<1>({&x}, out, [&](auto p, float* o, int64_t m) { row(p[0], o, m); });
}

void unary_backward_cpu(UnaryOp op, const Tensor& x, const Tensor& y, const Tensor& gy,
                        Tensor& gx) {
  check_float(ops::op_name(op), x.dtype());
  UnaryBwdRow row = AllUnary::bwd(op);
  map_spans<3>({&x, &y, &gy}, gx,
               [&](auto p, float* o, int64_t m) { row(p[0], p[1], p[2], o, m); });
}

MYRIAD_CPU_CLONES void pow_row(const float* x, float p, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = std::pow(x[i], p);
}
void pow_cpu(const Tensor& a, double p, Tensor& out) {
  check_float("pow", a.dtype());
  map_spans<1>({&a}, out, [&](auto ptr, float* o, int64_t m) {
    pow_row(ptr[0], static_cast<float>(p), o, m);
  });
}

MYRIAD_CPU_CLONES void axpy_row(float* a, const float* b, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) a[i] += alpha * b[i];
}
void axpy_cpu(Tensor& a, const Tensor& b, double alpha) {
  check_float("add_", a.dtype());
  map_spans<2>({&a, &b}, a, [&](auto p, float* o, int64_t m) {
    if (o != p[0]) std::memcpy(o, p[0], m * 4);
    axpy_row(o, p[1], static_cast<float>(alpha), m);
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::binary_kernels, ops::Backend::CPU, &binary_cpu);
MYRIAD_REGISTER_KERNEL(ops::scalar_kernels, ops::Backend::CPU, &scalar_cpu);
MYRIAD_REGISTER_KERNEL(ops::pow_kernels, ops::Backend::CPU, &pow_cpu);
MYRIAD_REGISTER_KERNEL(ops::unary_kernels, ops::Backend::CPU, &unary_cpu);
MYRIAD_REGISTER_KERNEL(ops::unary_backward_kernels, ops::Backend::CPU, &unary_backward_cpu);
MYRIAD_REGISTER_KERNEL(ops::axpy_kernels, ops::Backend::CPU, &axpy_cpu);

}  // namespace myriad::cpu
