// Device-side helpers of the CUDA kernels (included by .cu files only): element storage types
// with conversions that match core/dtype.h bit for bit, strided index maps passed by value,
// warp/block reductions and a launch wrapper that runs on the backend's stream.
#pragma once
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <utility>

#include "backend/cuda/cuda.h"
#include "core/error.h"
#include "core/tensor.h"

namespace myriad::gpu {

// 16-bit floats as raw bits.
struct Bf16 {
  uint16_t bits;
};
struct Half {
  uint16_t bits;
};

__device__ inline float bf16_bits_to_float(uint16_t h) {
  return __uint_as_float(static_cast<uint32_t>(h) << 16);
}
__device__ inline uint16_t float_to_bf16_bits(float f) {  // as f32_to_bf16
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
__device__ inline float half_bits_to_float(uint16_t h) {  // as f16_to_f32
  uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0) {
    float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (e == 31) return __uint_as_float(sign | 0x7f800000u | (m << 13));
  return __uint_as_float(sign | ((e + 112) << 23) | (m << 13));
}
__device__ inline uint16_t float_to_half_bits(float f) {  // as f32_to_f16
  uint32_t x = __float_as_uint(f);
  uint32_t sign = (x >> 16) & 0x8000u, mag = x & 0x7fffffffu;
  if (mag >= 0x7f800000u)
    return static_cast<uint16_t>(sign | 0x7c00u | (mag > 0x7f800000u ? 0x200u : 0));
  if (mag >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (mag < 0x38800000u) {
    float r = rintf(__uint_as_float(mag) * 16777216.0f);  // round half to even
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(r));
  }
  uint32_t h = (((mag >> 23) - 112) << 10) | ((mag & 0x7fffffu) >> 13);
  uint32_t rem = mag & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

// Floating storage type T, computed in Acc<T> (f32 for f32/bf16/f16, f64 for f64).
template <class T>
struct Num;
template <>
struct Num<float> {
  using Acc = float;
  __device__ static float load(float v) { return v; }
  __device__ static float store(float v) { return v; }
};
template <>
struct Num<double> {
  using Acc = double;
  __device__ static double load(double v) { return v; }
  __device__ static double store(double v) { return v; }
};
template <>
struct Num<Bf16> {
  using Acc = float;
  __device__ static float load(Bf16 v) { return bf16_bits_to_float(v.bits); }
  __device__ static Bf16 store(float v) { return {float_to_bf16_bits(v)}; }
};
template <>
struct Num<Half> {
  using Acc = float;
  __device__ static float load(Half v) { return half_bits_to_float(v.bits); }
  __device__ static Half store(float v) { return {float_to_half_bits(v)}; }
};
template <class T>
using Acc = typename Num<T>::Acc;
template <class T>
__device__ inline Acc<T> ld(const T& v) {
  return Num<T>::load(v);
}
template <class T>
__device__ inline T st(Acc<T> v) {
  return Num<T>::store(v);
}

// A tensor's data as a device pointer of storage type T.
template <class T>
const T* cptr(const Tensor& t) {
  return static_cast<const T*>(t.data_ptr());
}
template <class T>
T* mptr(Tensor& t) {
  return static_cast<T*>(t.data_ptr());
}

// Calls f(T{}) with the storage type of a floating dtype the float kernels support.
template <class F>
void dispatch_float(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::F32:
      return f(float{});
    case DType::BF16:
      return f(Bf16{});
    case DType::F64:
      return f(double{});
    default:
      throw Error(cat(op, ": the cuda kernel supports f32, bf16 and f64, not ", dtype_name(t)));
  }
}

// Row-major index -> element offsets of N operands that share a shape, for up to kMaxDims
// dimensions after size-1 dimensions are dropped and contiguous runs merged.
constexpr int kMaxDims = 8;
template <int N>
struct Layout {
  int rank = 1;
  int64_t shape[kMaxDims] = {1};
  int64_t strides[N][kMaxDims] = {};

  __device__ void offsets(int64_t i, int64_t (&off)[N]) const {
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = rank - 1; d > 0; --d) {
      const int64_t q = i / shape[d], r = i - q * shape[d];
      for (int k = 0; k < N; ++k) off[k] += r * strides[k][d];
      i = q;
    }
    for (int k = 0; k < N; ++k) off[k] += i * strides[k][0];
  }
};

template <int N>
Layout<N> make_layout(const char* op, const Shape& shape, std::array<const Shape*, N> strides) {
  Layout<N> l;
  int r = 0;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = r > 0;
    for (int k = 0; k < N && merge; ++k) merge = l.strides[k][r - 1] == (*strides[k])[d] * shape[d];
    if (merge) {
      l.shape[r - 1] *= shape[d];
      for (int k = 0; k < N; ++k) l.strides[k][r - 1] = (*strides[k])[d];
      continue;
    }
    MYRIAD_CHECK(r < kMaxDims, op, ": the cuda kernel handles at most ", kMaxDims,
                 " non-mergeable dimensions, got shape ", shape_str(shape));
    l.shape[r] = shape[d];
    for (int k = 0; k < N; ++k) l.strides[k][r] = (*strides[k])[d];
    ++r;
  }
  if (r == 0) {  // a single element
    l.shape[0] = 1;
    for (int k = 0; k < N; ++k) l.strides[k][0] = 0;
    r = 1;
  }
  l.rank = r;
  return l;
}

// Grid-stride loops: enough blocks to fill the GPU, each thread looping over the rest.
constexpr int kThreads = 256;
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}
__device__ inline int64_t global_thread() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t global_threads() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// Threads per row for the row kernels (one block per row; always whole warps).
inline int row_threads(int64_t n) {
  return n <= 64 ? 32 : n <= 512 ? 128 : n <= 4096 ? 256 : 512;
}

template <class T>
__device__ inline T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class T>
__device__ inline T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) {
    T w = __shfl_xor_sync(0xffffffffu, v, o);
    v = w > v ? w : v;
  }
  return v;
}

// Sum / max over a 1-d block (blockDim.x a multiple of 32); every thread gets the result.
// `scratch` holds 32 values and may be reused right after the call returns.
template <class T>
__device__ T block_sum(T v, T* scratch) {
  v = warp_sum(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_sum(lane < nw ? scratch[lane] : T(0));
  __syncthreads();
  return v;
}
template <class T>
__device__ T block_max(T v, T* scratch) {
  v = warp_max(v);
  if (blockDim.x == 32) return v;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = warp_max(lane < nw ? scratch[lane] : scratch[0]);
  __syncthreads();
  return v;
}

// Launches kernel on `device`'s backend stream and raises a launch error naming it.
template <class... P, class... A>
void launch(const char* name, int device, dim3 grid, dim3 block, void (*kernel)(P...),
            A&&... args) {
  DeviceGuard g(device);
  kernel<<<grid, block, 0, current_stream(device)>>>(std::forward<A>(args)...);
  CUDA_CHECK_LAUNCH(name);
}

}  // namespace myriad::gpu
