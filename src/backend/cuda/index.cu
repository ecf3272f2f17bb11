// CUDA indexing kernels (ops/index.h): gather, index_select, scatter_add, index_add, the
// embedding lookup and its backward, and weighted_index_add (the MoE's weighted combine, summed
// like the per-slice scatter below) and its backward. Gathers move raw elements, so they serve
// every dtype: a per-slice gather (index_select, embedding) copies whole rows with 2-d blocks (x
// over 16-, 8-, 4-, 2- or 1-byte units of a row, y over rows); a per-element gather runs one thread
// per output element. Scatter-adds are deterministic and atomic-free, accumulating in f32 (f64 for
// f64) and rounding each output once, as the CPU kernel does:
//   - per-element indices with few source rows or many columns: one thread per (outer, inner)
//     column walks the source rows in order (bf16 through an f32 copy of the output);
//   - otherwise, and always for per-slice indices (index_add, the embedding backward): a stable
//     radix sort (CUB) groups the sources by destination, then one thread (per-element) or one
//     block per column chunk (per-slice) sums each group in source order and writes it once.
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <climits>
#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "ops/index.h"

namespace myriad::gpu {
namespace {
using ops::dims_around;
using ops::IndexDims;

// Calls f(I{}) with the index type of an i32 / i64 index tensor.
template <class F>
void dispatch_index(const char* op, DType t, F&& f) {
  switch (t) {
    case DType::I64:
      return f(int64_t{});
    case DType::I32:
      return f(int32_t{});
    default:
      throw Error(cat(op, ": indices must be i32 or i64, got ", dtype_name(t)));
  }
}

// Calls f(U{}) with an unsigned type of the element size (gathers move raw bits).
template <class F>
void dispatch_bits(const char* op, DType t, F&& f) {
  switch (dtype_size(t)) {
    case 1:
      return f(uint8_t{});
    case 2:
      return f(uint16_t{});
    case 4:
      return f(uint32_t{});
    case 8:
      return f(uint64_t{});
    default:
      throw Error(cat(op, ": the cuda kernel does not support ", dtype_name(t)));
  }
}

// Calls f(U{}) with the widest copy unit (16, 8, 4, 2 or 1 bytes) that divides a row and to
// which both base pointers are aligned.
template <class F>
void dispatch_unit(int64_t row_bytes, const void* a, const void* b, F&& f) {
  auto fits = [&](int64_t w) {
    return row_bytes % w == 0 && reinterpret_cast<uintptr_t>(a) % w == 0 &&
           reinterpret_cast<uintptr_t>(b) % w == 0;
  };
  if (fits(16)) return f(uint4{});
  if (fits(8)) return f(uint2{});
  if (fits(4)) return f(uint32_t{});
  if (fits(2)) return f(uint16_t{});
  return f(uint8_t{});
}

// ---- gathers ----

// out row r (units wide) = x row (r / nout) * nx + idx[r % nout]. Blocks of (tx, ty) threads: x
// over a row's units, y over rows.
template <class U, class I>
__global__ void copy_rows_kernel(const U* __restrict__ x, const I* __restrict__ idx,
                                 U* __restrict__ out, int64_t rows, int64_t nout, int64_t nx,
                                 int64_t units) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t r = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; r < rows;
       r += step) {
    const int64_t o = r / nout;
    const U* s = x + (o * nx + static_cast<int64_t>(idx[r - o * nout])) * units;
    U* d = out + r * units;
    for (int64_t u = threadIdx.x; u < units; u += blockDim.x) d[u] = s[u];
  }
}

// Copies rows of `row_bytes` bytes: out row r = x row (r / nout) * nx + idx[r % nout].
template <class I>
void copy_rows(const char* op, int dev, const void* x, const I* idx, void* out, int64_t rows,
               int64_t nout, int64_t nx, int64_t row_bytes) {
  if (rows == 0 || row_bytes == 0) return;
  dispatch_unit(row_bytes, x, out, [&](auto tag) {
    using U = decltype(tag);
    const int64_t units = row_bytes / static_cast<int64_t>(sizeof(U));
    unsigned tx = 1;
    while (tx < units && tx < kThreads) tx <<= 1;
    const unsigned ty = kThreads / tx;
    launch(op, dev, grid_for(rows, static_cast<int>(ty)), dim3(tx, ty), &copy_rows_kernel<U, I>,
           static_cast<const U*>(x), idx, static_cast<U*>(out), rows, nout, nx, units);
  });
}

// out[o, j, i] = x[o, idx[o, j, i], i] over [outer, nout, inner] / [outer, nx, inner].
template <class U, class I>
__global__ void gather_elements_kernel(const U* __restrict__ x, const I* __restrict__ idx,
                                       U* __restrict__ out, int64_t total, int64_t nout, int64_t nx,
                                       int64_t inner) {
  for (int64_t e = global_thread(); e < total; e += global_threads()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / nout;
    out[e] = x[(o * nx + static_cast<int64_t>(idx[e])) * inner + i];
  }
}

void gather_cuda(const Tensor& x, int64_t dim, const Tensor& idx, Tensor& out) {
  const char* op = "gather";
  const IndexDims dx = dims_around(x.shape(), dim), dout = dims_around(out.shape(), dim);
  if (out.numel() == 0) return;
  MYRIAD_CHECK(dx.outer == dout.outer && dx.inner == dout.inner, op,
               ": input and output disagree outside dimension ", dim, ": ", x.desc(), " vs ",
               out.desc());
  const bool per_slice = idx.numel() != out.numel();
  const int dev = out.device().index;
  dispatch_index(op, idx.dtype(), [&](auto itag) {
    using I = decltype(itag);
    if (per_slice) {  // whole slices of inner elements move at once
      copy_rows(op, dev, x.data_ptr(), cptr<I>(idx), out.data_ptr(), dout.outer * dout.n, dout.n,
                dx.n, dout.inner * static_cast<int64_t>(dtype_size(x.dtype())));
      return;
    }
    dispatch_bits(op, x.dtype(), [&](auto btag) {
      using U = decltype(btag);
      const int64_t total = out.numel();
      launch(op, dev, grid_for(total), kThreads, &gather_elements_kernel<U, I>, cptr<U>(x),
             cptr<I>(idx), mptr<U>(out), total, dout.n, dx.n, dout.inner);
    });
  });
}

void embedding_cuda(const Tensor& weight, const Tensor& ids, Tensor& out) {
  const int64_t n = ids.numel(), V = weight.shape()[0], D = weight.shape()[1];
  if (n == 0 || D == 0) return;
  dispatch_index("embedding", ids.dtype(), [&](auto itag) {
    using I = decltype(itag);
    copy_rows("embedding", out.device().index, weight.data_ptr(), cptr<I>(ids), out.data_ptr(), n,
              n, V, D * static_cast<int64_t>(dtype_size(weight.dtype())));
  });
}

// ---- scatter-adds ----

template <class T>
__global__ void widen_kernel(const T* __restrict__ x, Acc<T>* __restrict__ y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) y[i] = ld(x[i]);
}
template <class T>
__global__ void narrow_kernel(const Acc<T>* __restrict__ x, T* __restrict__ y, int64_t n) {
  for (int64_t i = global_thread(); i < n; i += global_threads()) y[i] = st<T>(x[i]);
}

// acc [outer, no, inner] += scatter of src [outer, ns, inner] with per-element idx (src's
// shape): one thread per (outer, inner) column, which alone writes that column of acc and visits
// the source rows in order.
template <class S, class I>
__global__ void scatter_columns_kernel(Acc<S>* __restrict__ acc, const S* __restrict__ src,
                                       const I* __restrict__ idx, int64_t outer, int64_t ns,
                                       int64_t no, int64_t inner) {
  const int64_t cols = outer * inner;
  for (int64_t c = global_thread(); c < cols; c += global_threads()) {
    const int64_t o = c / inner, i = c - o * inner;
    Acc<S>* a = acc + o * no * inner + i;
    const int64_t b = o * ns * inner + i;
    for (int64_t j = 0; j < ns; ++j) {
      const int64_t e = b + j * inner;
      a[static_cast<int64_t>(idx[e]) * inner] += ld(src[e]);
    }
  }
}

// Sort keys: the destination (an element of out, or a slice along dim) of each source element or
// slice; values: the source's position. A stable sort keeps the sources of one destination in
// source order.
template <class K, class I>
__global__ void element_keys_kernel(const I* __restrict__ idx, int64_t m, int64_t ns, int64_t no,
                                    int64_t inner, K* __restrict__ keys,
                                    int32_t* __restrict__ pos) {
  for (int64_t e = global_thread(); e < m; e += global_threads()) {
    const int64_t r = e / inner, i = e - r * inner, o = r / ns;
    keys[e] = static_cast<K>((o * no + static_cast<int64_t>(idx[e])) * inner + i);
    pos[e] = static_cast<int32_t>(e);
  }
}
template <class K, class I>
__global__ void slice_keys_kernel(const I* __restrict__ idx, int64_t m, K* __restrict__ keys,
                                  int32_t* __restrict__ pos) {
  for (int64_t e = global_thread(); e < m; e += global_threads()) {
    keys[e] = static_cast<K>(idx[e]);
    pos[e] = static_cast<int32_t>(e);
  }
}

// The end of the run of keys equal to keys[p] (sorted ascending): a galloping search, so short
// runs cost a load or two.
template <class K>
__device__ int64_t run_end(const K* keys, int64_t p, int64_t m) {
  const K key = keys[p];
  int64_t lo = p + 1, hi = m, step = 1;  // keys[p, lo) == key
  while (true) {
    const int64_t probe = p + step;
    if (probe >= m) break;
    if (keys[probe] != key) {
      hi = probe;
      break;
    }
    lo = probe + 1;
    step <<= 1;
  }
  while (lo < hi) {  // the first index in [lo, hi) whose key differs, else hi
    const int64_t mid = lo + ((hi - lo) >> 1);
    if (keys[mid] != key)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// out[key] = out[key] + the sorted sources of that key, in order: one thread per run head.
template <class T, class K>
__global__ void element_runs_kernel(T* __restrict__ out, const T* __restrict__ src,
                                    const K* __restrict__ keys, const int32_t* __restrict__ pos,
                                    int64_t m) {
  for (int64_t p = global_thread(); p < m; p += global_threads()) {
    const K key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;
    const int64_t end = run_end(keys, p, m);
    Acc<T> acc = ld(out[key]);
#pragma unroll 4
    for (int64_t q = p; q < end; ++q) acc += ld(src[pos[q]]);
    out[key] = st<T>(acc);
  }
}

// Products rounded before they are summed (no fused multiply-add), as the CPU kernels round
// them: weighted_index_add's f32 results then have the bits of mul followed by index_add.
__device__ inline float mul_rn(float a, float b) {
  return __fmul_rn(a, b);
}
__device__ inline double mul_rn(double a, double b) {
  return __dmul_rn(a, b);
}

// Per-slice: out [outer, no, inner] slice key += the src [outer, ns, inner] slices sorted under
// it, in order, each times w[source] when w is given (weighted_index_add). Blocks: x over run heads
// (a block skips non-heads), y over gridDim.y equal chunks of the outer * inner columns. sum_first
// (the embedding backward) sums the sources from zero and adds the total to out, as the CPU kernel
// does; otherwise the sum starts from out (scatter_add).
template <class T, class K>
__global__ void slice_runs_kernel(T* __restrict__ out, const T* __restrict__ src,
                                  const T* __restrict__ w, const K* __restrict__ keys,
                                  const int32_t* __restrict__ pos, int64_t ns, int64_t no,
                                  int64_t inner, int64_t cols, bool sum_first) {
  using A = Acc<T>;
  for (int64_t p = blockIdx.x; p < ns; p += gridDim.x) {
    const K key = keys[p];
    if (p > 0 && keys[p - 1] == key) continue;  // the same for the whole block
    const int64_t end = run_end(keys, p, ns);
    const int64_t per_chunk = (cols + gridDim.y - 1) / gridDim.y;
    const int64_t c0 = blockIdx.y * per_chunk, c1 = min(cols, c0 + per_chunk);
    for (int64_t c = c0 + threadIdx.x; c < c1; c += blockDim.x) {
      const int64_t o = c / inner, i = c - o * inner;
      const T* s = src + o * ns * inner + i;
      T* d = out + (o * no + static_cast<int64_t>(key)) * inner + i;
      A acc = sum_first ? A(0) : ld(*d);
#pragma unroll 4
      for (int64_t q = p; q < end; ++q) {
        const int64_t j = pos[q];
        acc += w ? mul_rn(ld(w[j]), ld(s[j * inner])) : ld(s[j * inner]);
      }
      *d = st<T>(sum_first ? ld(*d) + acc : acc);
    }
  }
}

// Sorted (key, source position) pairs; the tensors keep the device buffers alive.
struct Sorted {
  Tensor keys, pos;
};

// Calls f(K{}) with the narrowest unsigned key type that holds max_key.
template <class F>
void dispatch_key(uint64_t max_key, F&& f) {
  if (max_key <= UINT32_MAX) return f(uint32_t{});
  return f(uint64_t{});
}

// Fills m (key, position) pairs with make(keys, pos) and sorts them stably by key on dev's stream.
template <class K, class Make>
Sorted sort_pairs(const char* op, Device device, int64_t m, uint64_t max_key, Make&& make) {
  MYRIAD_CHECK(m <= INT_MAX, op, ": the cuda kernel sorts at most ", INT_MAX, " indices, got ", m);
  const DType kt = sizeof(K) == 4 ? DType::I32 : DType::I64;
  Tensor keys_in = Tensor::empty({m}, kt, device), pos_in = Tensor::empty({m}, DType::I32, device);
  Sorted r{Tensor::empty({m}, kt, device), Tensor::empty({m}, DType::I32, device)};
  make(mptr<K>(keys_in), mptr<int32_t>(pos_in));
  int end_bit = 1;
  while (end_bit < 64 && (max_key >> end_bit) != 0) ++end_bit;
  const int dev = device.index;
  DeviceGuard g(dev);
  cudaStream_t stream = current_stream(dev);
  size_t bytes = 0;
  const int n = static_cast<int>(m);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, bytes, cptr<K>(keys_in), mptr<K>(r.keys),
                                             cptr<int32_t>(pos_in), mptr<int32_t>(r.pos), n, 0,
                                             end_bit, stream));
  Tensor tmp =
      Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(bytes))}, DType::U8, device);
  CUDA_CHECK(cub::DeviceRadixSort::SortPairs(tmp.data_ptr(), bytes, cptr<K>(keys_in),
                                             mptr<K>(r.keys), cptr<int32_t>(pos_in),
                                             mptr<int32_t>(r.pos), n, 0, end_bit, stream));
  CUDA_CHECK_LAUNCH(op);
  return r;
}

// out [outer, no, inner] += the sorted scatter of per-slice src [outer, ns, inner] (idx [ns]),
// each slice times w[slice] when w is given.
template <class T, class I>
void scatter_slices(const char* op, Tensor& out, const I* idx, const Tensor& src, int64_t outer,
                    int64_t ns, int64_t no, int64_t inner, bool sum_first, const T* w = nullptr) {
  const int dev = out.device().index;
  dispatch_key(static_cast<uint64_t>(no > 0 ? no - 1 : 0), [&](auto ktag) {
    using K = decltype(ktag);
    Sorted s = sort_pairs<K>(op, out.device(), ns, no - 1, [&](K* keys, int32_t* pos) {
      launch(op, dev, grid_for(ns), kThreads, &slice_keys_kernel<K, I>, idx, ns, keys, pos);
    });
    // Chunks of up to 4 columns per thread: a block does a fair share of work, and a run with
    // many sources (a frequent token) still spreads over several blocks.
    const int64_t cols = outer * inner;
    const int64_t threads = std::min<int64_t>(kThreads, (cols + 31) / 32 * 32);
    const int64_t chunks = std::min<int64_t>((cols + 4 * threads - 1) / (4 * threads), 65535);
    const int64_t heads = std::min<int64_t>(ns, INT_MAX);
    launch(op, dev, dim3(static_cast<unsigned>(heads), static_cast<unsigned>(chunks)),
           static_cast<unsigned>(threads), &slice_runs_kernel<T, K>, mptr<T>(out), cptr<T>(src), w,
           cptr<K>(s.keys), cptr<int32_t>(s.pos), ns, no, inner, cols, sum_first);
  });
}

// out [outer, no, inner] += the scatter of src [outer, ns, inner] under per-element idx.
template <class T, class I>
void scatter_elements(const char* op, Tensor& out, const I* idx, const Tensor& src, int64_t outer,
                      int64_t ns, int64_t no, int64_t inner) {
  using A = Acc<T>;
  const int dev = out.device().index;
  const int64_t cols = outer * inner, m = src.numel();
  if (ns <= 64 || cols >= 2048) {  // one thread per column is parallel (or short) enough
    auto run = [&](A* acc) {
      launch(op, dev, grid_for(cols), kThreads, &scatter_columns_kernel<T, I>, acc, cptr<T>(src),
             idx, outer, ns, no, inner);
    };
    if constexpr (std::is_same_v<T, A>) {
      run(mptr<A>(out));
    } else {  // accumulate in an f32 copy, rounding once at the end
      const int64_t n = out.numel();
      Tensor acc = Tensor::empty(out.shape(), DType::F32, out.device());
      launch(op, dev, grid_for(n), kThreads, &widen_kernel<T>, cptr<T>(out), mptr<A>(acc), n);
      run(mptr<A>(acc));
      launch(op, dev, grid_for(n), kThreads, &narrow_kernel<T>, cptr<A>(acc), mptr<T>(out), n);
    }
    return;
  }
  // Few long columns: sort the sources by destination element and sum each run in order.
  const uint64_t max_key = static_cast<uint64_t>(out.numel() - 1);
  dispatch_key(max_key, [&](auto ktag) {
    using K = decltype(ktag);
    Sorted s = sort_pairs<K>(op, out.device(), m, max_key, [&](K* keys, int32_t* pos) {
      launch(op, dev, grid_for(m), kThreads, &element_keys_kernel<K, I>, idx, m, ns, no, inner,
             keys, pos);
    });
    launch(op, dev, grid_for(m), kThreads, &element_runs_kernel<T, K>, mptr<T>(out), cptr<T>(src),
           cptr<K>(s.keys), cptr<int32_t>(s.pos), m);
  });
}

void scatter_add_cuda(Tensor& out, int64_t dim, const Tensor& idx, const Tensor& src) {
  const char* op = "scatter_add";
  const IndexDims dout = dims_around(out.shape(), dim), ds = dims_around(src.shape(), dim);
  if (src.numel() == 0 || out.numel() == 0) return;
  MYRIAD_CHECK(dout.outer == ds.outer && dout.inner == ds.inner, op,
               ": output and source disagree outside dimension ", dim, ": ", out.desc(), " vs ",
               src.desc());
  const bool per_slice = idx.numel() != src.numel();
  dispatch_float(op, out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(op, idx.dtype(), [&](auto itag) {
      using I = decltype(itag);
      if (per_slice)
        scatter_slices<T, I>(op, out, cptr<I>(idx), src, ds.outer, ds.n, dout.n, ds.inner, false);
      else
        scatter_elements<T, I>(op, out, cptr<I>(idx), src, ds.outer, ds.n, dout.n, ds.inner);
    });
  });
}

// grad_w [V, D] += the rows of grad_out [n, D] under their ids: the per-slice scatter with
// outer = 1, each vocabulary row summing its tokens in token order and adding the total once.
void embedding_backward_cuda(const Tensor& grad_out, const Tensor& ids, Tensor& grad_w) {
  const char* op = "embedding_backward";
  const int64_t V = grad_w.shape()[0], D = grad_w.shape()[1], n = ids.numel();
  if (n == 0 || D == 0 || V == 0) return;
  dispatch_float(op, grad_w.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(op, ids.dtype(), [&](auto itag) {
      using I = decltype(itag);
      scatter_slices<T, I>(op, grad_w, cptr<I>(ids), grad_out, 1, n, V, D, true);
    });
  });
}

// ---- weighted_index_add: out[idx[i]] += w[i] * src[i] (the MoE's weighted combine) ----

// Per source row i (a warp each, blockDim (32, rows)): dsrc[i] = w[i] g[idx[i]] and
// dw[i] = g[idx[i]] . src[i] (the products rounded, then a warp sum: the CPU's row sum adds in
// another order, so dw agrees within rounding, not bit for bit).
template <class T, class I>
__global__ void weighted_index_add_backward_kernel(const I* __restrict__ idx,
                                                   const T* __restrict__ src,
                                                   const T* __restrict__ w, const T* __restrict__ g,
                                                   T* __restrict__ dsrc, T* __restrict__ dw,
                                                   int64_t m, int64_t D) {
  using A = Acc<T>;
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.y;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y; i < m; i += step) {
    const T* gr = g + static_cast<int64_t>(idx[i]) * D;
    const A wi = ld(w[i]);
    A dot = A(0);
    for (int64_t d = threadIdx.x; d < D; d += 32) {
      const A gv = ld(gr[d]);
      if (dw) dot += mul_rn(gv, ld(src[i * D + d]));
      if (dsrc) dsrc[i * D + d] = st<T>(mul_rn(wi, gv));
    }
    if (dw) {
      dot = warp_sum(dot);
      if (threadIdx.x == 0) dw[i] = st<T>(dot);
    }
  }
}

void weighted_index_add_cuda(const Tensor& idx, const Tensor& src, const Tensor& w, Tensor& out) {
  const char* op = "weighted_index_add";
  const int64_t M = src.shape()[0], D = src.shape()[1], n = out.shape()[0];
  if (n == 0 || D == 0) return;
  const int dev = out.device().index;
  {  // rows no index names stay zero (zero bits are 0 in every float dtype)
    DeviceGuard g(dev);
    CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.numel() * dtype_size(out.dtype()),
                               current_stream(dev)));
  }
  if (M == 0) return;
  dispatch_float(op, src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(op, idx.dtype(), [&](auto itag) {
      using I = decltype(itag);
      // Each destination row: 0 + its sources' w[i] src[i] in source order, rounded once.
      scatter_slices<T, I>(op, out, cptr<I>(idx), src, 1, M, n, D, false, cptr<T>(w));
    });
  });
}

void weighted_index_add_backward_cuda(const Tensor& idx, const Tensor& src, const Tensor& w,
                                      const Tensor& g, Tensor& dsrc, Tensor& dw) {
  const char* op = "weighted_index_add_backward";
  const int64_t M = src.shape()[0], D = src.shape()[1];
  if (M == 0) return;
  const int dev = src.device().index;
  if (D == 0) {  // dw is an empty sum; dsrc is empty
    if (dw.defined()) {
      DeviceGuard guard(dev);
      CUDA_CHECK(cudaMemsetAsync(dw.data_ptr(), 0, dw.numel() * dtype_size(dw.dtype()),
                                 current_stream(dev)));
    }
    return;
  }
  dispatch_float(op, src.dtype(), [&](auto tag) {
    using T = decltype(tag);
    dispatch_index(op, idx.dtype(), [&](auto itag) {
      using I = decltype(itag);
      constexpr int kRows = 8;  // warps (source rows) per block
      launch(op, dev, grid_for(M, kRows), dim3(32, kRows),
             &weighted_index_add_backward_kernel<T, I>, cptr<I>(idx), cptr<T>(src), cptr<T>(w),
             cptr<T>(g), dsrc.defined() ? mptr<T>(dsrc) : nullptr,
             dw.defined() ? mptr<T>(dw) : nullptr, M, D);
    });
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gather_kernels, ops::Backend::CUDA, &gather_cuda);
MYRIAD_REGISTER_KERNEL(ops::scatter_add_kernels, ops::Backend::CUDA, &scatter_add_cuda);
MYRIAD_REGISTER_KERNEL(ops::embedding_kernels, ops::Backend::CUDA, &embedding_cuda);
MYRIAD_REGISTER_KERNEL(ops::embedding_backward_kernels, ops::Backend::CUDA,
                       &embedding_backward_cuda);
MYRIAD_REGISTER_KERNEL(ops::weighted_index_add_kernels, ops::Backend::CUDA,
                       &weighted_index_add_cuda);
MYRIAD_REGISTER_KERNEL(ops::weighted_index_add_backward_kernels, ops::Backend::CUDA,
                       &weighted_index_add_backward_cuda);

}  // namespace myriad::gpu
