// Strided, dtype-converting copy and fill on the CPU.
#include <algorithm>
#include <bit>
#include <cstring>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "core/copy.h"
#include "core/dtype.h"
#include "core/strided.h"

namespace myriad::cpu {
namespace {

template <class S, class D>
inline D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else {
    return static_cast<D>(v);
  }
}

// dst[i * sd] = src[i * ss] for i < n, elements of type T.
template <class T>
void copy_row(const char* ps, int64_t ss, char* pd, int64_t sd, int64_t n) {
  const T* s = reinterpret_cast<const T*>(ps);
  T* d = reinterpret_cast<T*>(pd);
  for (int64_t i = 0; i < n; ++i) d[i * sd] = s[i * ss];
}

// A same-dtype copy with strides: row by row along the last dimension (a memcpy where both rows
// are contiguous), the rows split over the threads. A chunk's first row finds its offsets from
// its index; the next rows step them like an odometer (a division per dimension and row cost
// 17 us for a decode step's 1536 rows of 2 elements, 30x the bytes' copy). Rows of fewer than
// 16 elements run along the longest dimension instead (the same elements in another order): a
// batched decode step's conv-state shift had 24576 rows of 1 element.
void copy_strided_rows(const Tensor& src, Tensor& dst) {
  if (dst.numel() == 0) return;
  Shape shape = dst.shape(), st_s = src.strides(), st_d = dst.strides();
  const size_t longest =
      static_cast<size_t>(std::max_element(shape.begin(), shape.end()) - shape.begin());
  if (shape.back() < 16 && shape[longest] > shape.back()) {
    std::swap(shape[longest], shape.back());
    std::swap(st_s[longest], st_s.back());
    std::swap(st_d[longest], st_d.back());
  }
  const int64_t rank = static_cast<int64_t>(shape.size()), last = shape[rank - 1];
  const int64_t rows = dst.numel() / last, ss = st_s[rank - 1], sd = st_d[rank - 1];
  const int64_t es = static_cast<int64_t>(dtype_size(dst.dtype()));
  const char* ps = static_cast<const char*>(src.data_ptr());
  char* pd = static_cast<char*>(dst.data_ptr());
  parallel_for(rows, std::max<int64_t>(1, (int64_t{1} << 14) / last), [&](int64_t b, int64_t e) {
    std::vector<int64_t> idx(static_cast<size_t>(rank), 0);  // row b's index (the last unused)
    int64_t os = 0, od = 0;
    for (int64_t d = rank - 2, q = b; d >= 0; --d) {
      idx[d] = q % shape[d];
      q /= shape[d];
      os += idx[d] * st_s[d];
      od += idx[d] * st_d[d];
    }
    for (int64_t r = b; r < e; ++r) {
      const char* s = ps + os * es;
      char* t = pd + od * es;
      if (ss == 1 && sd == 1)
        std::memcpy(t, s, static_cast<size_t>(last * es));
      else if (es == 4)
        copy_row<uint32_t>(s, ss, t, sd, last);
      else if (es == 2)
        copy_row<uint16_t>(s, ss, t, sd, last);
      else if (es == 8)
        copy_row<uint64_t>(s, ss, t, sd, last);
      else
        copy_row<uint8_t>(s, ss, t, sd, last);
      for (int64_t d = rank - 2; d >= 0; --d) {  // the next row
        os += st_s[d], od += st_d[d];
        if (++idx[d] < shape[d]) break;
        os -= shape[d] * st_s[d], od -= shape[d] * st_d[d];
        idx[d] = 0;
      }
    }
  });
}

void copy_cpu(const Tensor& src, Tensor& dst) {
  const char* ps = static_cast<const char*>(src.data_ptr());
  char* pd = static_cast<char*>(dst.data_ptr());
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    size_t bytes = src.nbytes();
    parallel_for(static_cast<int64_t>(bytes), 1 << 20,
                 [&](int64_t b, int64_t e) { std::memcpy(pd + b, ps + b, e - b); });
    return;
  }
  DType ts = src.dtype(), td = dst.dtype();
  if (ts == td) {
    if (dst.dim() > 0) return copy_strided_rows(src, dst);
    std::memcpy(pd, ps, dtype_size(ts));
    return;
  }
  // Between float types through f32 (f64 through double), integers through int64.
  bool via_double = ts == DType::F64 || td == DType::F64 || !is_floating(ts) || !is_floating(td);
  if (src.is_contiguous() && dst.is_contiguous() && !via_double) {
    int64_t n = src.numel();
    // f32 <-> bf16 (a bf16 training step's casts): the vectorised row converters, in pieces of
    // 16K elements, so a MoE expert's 32K-element weight (most of a model's parameters, one
    // tensor at a time) runs on two threads.
    if (ts == DType::F32 && td == DType::BF16)
      return parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
        f32_row_to_bf16(reinterpret_cast<const float*>(ps) + b, reinterpret_cast<uint16_t*>(pd) + b,
                        e - b);
      });
    if (ts == DType::BF16 && td == DType::F32)
      return parallel_for(n, 1 << 14, [&](int64_t b, int64_t e) {
        bf16_row_to_f32(reinterpret_cast<const uint16_t*>(ps) + b, reinterpret_cast<float*>(pd) + b,
                        e - b);
      });
    parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        float v = ts == DType::F32    ? reinterpret_cast<const float*>(ps)[i]
                  : ts == DType::BF16 ? bf16_load(reinterpret_cast<const uint16_t*>(ps)[i])
                                      : f16_to_f32(reinterpret_cast<const uint16_t*>(ps)[i]);
        if (td == DType::F32)
          reinterpret_cast<float*>(pd)[i] = v;
        else if (td == DType::BF16)
          reinterpret_cast<uint16_t*>(pd)[i] = f32_to_bf16(v);
        else
          reinterpret_cast<uint16_t*>(pd)[i] = f32_to_f16(v);
      }
    });
    return;
  }
  for_each_offset<2>(dst.shape(), {&src.strides(), &dst.strides()}, [&](auto o) {
    if (!is_floating(ts) && !is_floating(td)) {
      int64_t v = ts == DType::I64   ? reinterpret_cast<const int64_t*>(ps)[o[0]]
                  : ts == DType::I32 ? reinterpret_cast<const int32_t*>(ps)[o[0]]
                                     : reinterpret_cast<const uint8_t*>(ps)[o[0]];
      if (td == DType::I64)
        reinterpret_cast<int64_t*>(pd)[o[1]] = v;
      else
        store_from_double(pd, td, o[1], static_cast<double>(v));
    } else {
      store_from_double(pd, td, o[1], load_as_double(ps, ts, o[0]));
    }
  });
}

template <class T>
void fill_typed(T* p, int64_t n, T v) {
  parallel_for(n, 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = v;
  });
}

void fill_cpu(Tensor& dst, double value) {
  if (!dst.is_contiguous()) {
    Tensor tmp = Tensor::empty(dst.shape(), dst.dtype(), dst.device());
    fill_cpu(tmp, value);
    copy_cpu(tmp, dst);
    return;
  }
  void* p = dst.data_ptr();
  int64_t n = dst.numel();
  switch (dst.dtype()) {
    case DType::F32:
      fill_typed(static_cast<float*>(p), n, static_cast<float>(value));
      break;
    case DType::F64:
      fill_typed(static_cast<double*>(p), n, value);
      break;
    case DType::BF16:
      fill_typed(static_cast<uint16_t*>(p), n, f32_to_bf16(static_cast<float>(value)));
      break;
    case DType::F16:
      fill_typed(static_cast<uint16_t*>(p), n, f32_to_f16(static_cast<float>(value)));
      break;
    case DType::I32:
      fill_typed(static_cast<int32_t*>(p), n, static_cast<int32_t>(value));
      break;
    case DType::I64:
      fill_typed(static_cast<int64_t*>(p), n, static_cast<int64_t>(value));
      break;
    case DType::U8:
      fill_typed(static_cast<uint8_t*>(p), n, static_cast<uint8_t>(value));
      break;
  }
}

const bool registered = (register_copy_kernels(DeviceType::CPU, &copy_cpu, &fill_cpu), true);

}  // namespace
}  // namespace myriad::cpu
