// Strided, dtype-converting copy and fill on the CPU.
#include <cstring>

#include "backend/cpu/cpu.h"
#include "core/copy.h"
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
  size_t ss = dtype_size(ts), sd = dtype_size(td);
  if (ts == td) {
    for_each_offset<2>(dst.shape(), {&src.strides(), &dst.strides()},
                       [&](auto o) { std::memcpy(pd + o[1] * sd, ps + o[0] * ss, ss); });
    return;
  }
  // Between float types through f32 (f64 through double), integers through int64.
  bool via_double = ts == DType::F64 || td == DType::F64 || !is_floating(ts) || !is_floating(td);
  if (src.is_contiguous() && dst.is_contiguous() && !via_double) {
    int64_t n = src.numel();
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
