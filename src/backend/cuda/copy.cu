// Strided, dtype-converting copy and fill on CUDA devices (core/copy.h), and the k = 0 GEMM
// helper. Conversions follow the CPU kernels: between float types through f32, through f64 when
// an f64 or integer type is involved, integer to integer directly.
#include <cstring>
#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "core/copy.h"

namespace myriad::gpu {
namespace {

template <class T>
constexpr bool kInt = std::is_integral_v<T>;

template <class T>
__device__ double to_double(T v) {
  if constexpr (kInt<T>)
    return static_cast<double>(v);
  else
    return static_cast<double>(ld(v));
}
template <class D>
__device__ D from_double(double v) {
  if constexpr (kInt<D> || std::is_same_v<D, double>)
    return static_cast<D>(v);
  else
    return Num<D>::store(static_cast<float>(v));
}
template <class S, class D>
__device__ D convert(S v) {
  if constexpr (std::is_same_v<S, D>)
    return v;
  else if constexpr (kInt<S> && kInt<D>)
    return static_cast<D>(v);
  else if constexpr (kInt<S> || kInt<D> || std::is_same_v<S, double> || std::is_same_v<D, double>)
    return from_double<D>(to_double(v));
  else
    return Num<D>::store(Num<S>::load(v));
}

template <class S, class D>
__global__ void copy_kernel(const S* src, D* dst, Layout<2> l, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    int64_t off[2];
    l.offsets(i, off);
    dst[off[1]] = convert<S, D>(src[off[0]]);
  }
}

template <class U>
__global__ void fill_kernel(U* dst, U v, Layout<1> l, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    int64_t off[1];
    l.offsets(i, off);
    dst[off[0]] = v;
  }
}

template <class T>
__global__ void scale_kernel(T* c, Acc<T> beta, Layout<1> l, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) {
    int64_t off[1];
    l.offsets(i, off);
    c[off[0]] = st<T>(beta == Acc<T>(0) ? Acc<T>(0) : beta * ld(c[off[0]]));
  }
}

// Calls f(T{}) with the storage type of any dtype.
template <class F>
void dispatch_any(DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(float{});
    case DType::F64:
      return f(double{});
    case DType::BF16:
      return f(Bf16{});
    case DType::F16:
      return f(Half{});
    case DType::I32:
      return f(int32_t{});
    case DType::I64:
      return f(int64_t{});
    case DType::U8:
      return f(uint8_t{});
  }
}

void copy_cuda(const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  const int dev = dst.device().index;
  if (src.dtype() == dst.dtype() && src.is_contiguous() && dst.is_contiguous()) {
    DeviceGuard g(dev);
    CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), dst.nbytes(),
                               cudaMemcpyDeviceToDevice, current_stream(dev)));
    return;
  }
  const Layout<2> l = make_layout<2>("copy", dst.shape(), {&src.strides(), &dst.strides()});
  dispatch_any(src.dtype(), [&](auto s) {
    dispatch_any(dst.dtype(), [&](auto d) {
      using S = decltype(s);
      using D = decltype(d);
      launch("copy", dev, grid_for(n), kThreads, &copy_kernel<S, D>,
             static_cast<const S*>(src.data_ptr()), static_cast<D*>(dst.data_ptr()), l, n);
    });
  });
}

template <class U>
void fill_as(Tensor& dst, uint64_t bits, const Layout<1>& l) {
  U v;
  std::memcpy(&v, &bits, sizeof(U));  // the low bytes on little-endian hosts
  launch("fill", dst.device().index, grid_for(dst.numel()), kThreads, &fill_kernel<U>,
         static_cast<U*>(dst.data_ptr()), v, l, dst.numel());
}

void fill_cuda(Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  uint64_t bits = 0;  // the value's bit pattern in dst's dtype, converted as on the CPU
  store_from_double(&bits, dst.dtype(), 0, value);
  const Layout<1> l = make_layout<1>("fill", dst.shape(), {&dst.strides()});
  switch (dtype_size(dst.dtype())) {
    case 1:
      return fill_as<uint8_t>(dst, bits, l);
    case 2:
      return fill_as<uint16_t>(dst, bits, l);
    case 4:
      return fill_as<uint32_t>(dst, bits, l);
    default:
      return fill_as<uint64_t>(dst, bits, l);
  }
}

const bool registered = (register_copy_kernels(DeviceType::CUDA, &copy_cuda, &fill_cuda), true);

}  // namespace

void scale_matrices(void* c, DType t, int64_t batch, int64_t rows, int64_t cols, int64_t ld,
                    int64_t stride, float beta, int device) {
  const int64_t n = batch * rows * cols;
  if (n == 0) return;
  const Shape shape{batch, rows, cols}, strides{stride, ld, 1};
  const Layout<1> l = make_layout<1>("gemm", shape, {&strides});
  dispatch_float("gemm", t, [&](auto tag) {
    using T = decltype(tag);
    launch("gemm_scale", device, grid_for(n), kThreads, &scale_kernel<T>, static_cast<T*>(c),
           static_cast<Acc<T>>(beta), l, n);
  });
}

}  // namespace myriad::gpu
