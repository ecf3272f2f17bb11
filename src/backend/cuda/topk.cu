// CUDA top-k over the rows of a contiguous [rows, n] tensor (ops/topk.h): largest first, ties in
// index order, NaN above every number. One block per row. Values map to unsigned keys that order
// as ops::topk_before does (NaN highest, -0 == +0); a radix select (8-bit digits, a shared
// histogram per pass with warp-aggregated adds, stopping once the k-th key's bucket is taken
// whole) finds the k-th key, then one ordered pass compacts the k winners: every key above it and
// the first equal ones in index order. Up to kSortCap winners are bitonic-sorted by (key, index) in
// shared memory and written out; larger k goes through a global buffer and a stable segmented radix
// sort (CUB). Values are copies of the picked elements, so they are exact in every dtype.
#include <cub/device/device_segmented_radix_sort.cuh>

#include <climits>
#include <type_traits>

#include "backend/cuda/kernels.cuh"
#include "ops/topk.h"

namespace myriad::gpu {
namespace {

constexpr int kSortCap = 2048;  // winners sorted in shared memory (a power of two)
constexpr int kMaxThreads = 1024;
constexpr int kU = 4;  // elements per thread per tile of a pass

// Keys whose unsigned order is ops::topk_before's value order.
__device__ inline uint32_t order_key(float v) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0xffffffffu;  // NaN
  if ((u & 0x7fffffffu) == 0) u = 0;                        // -0 ties with +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ inline uint64_t order_key(double v) {
  uint64_t u = static_cast<uint64_t>(__double_as_longlong(v));
  constexpr uint64_t kSign = 1ull << 63, kAbs = kSign - 1, kInf = 0x7ff0000000000000ull;
  if ((u & kAbs) > kInf) return ~0ull;
  if ((u & kAbs) == 0) u = 0;
  return (u & kSign) ? ~u : (u | kSign);
}
template <class T>
using Key = decltype(order_key(Acc<T>{}));

// Does (ka at ia) come before (kb at ib)?
template <class K>
__device__ inline bool before(K ka, uint32_t ia, K kb, uint32_t ib) {
  return ka > kb || (ka == kb && ia < ib);
}

// Top-k of each row. With gkeys == nullptr the winners are sorted here and written to values /
// indices; otherwise they go, in index order within each class (above the k-th key, equal to
// it), to gkeys / gidx [rows, k] for a stable sort. low_bit: the lowest key bit that can be set
// (16 for bf16, whose keys end in 16 zero bits).
template <class T>
__global__ void __launch_bounds__(kMaxThreads)
    topk_kernel(const T* __restrict__ x, int64_t rows, int64_t n, int64_t k, int low_bit,
                T* __restrict__ values, int64_t* __restrict__ indices, Key<T>* __restrict__ gkeys,
                uint32_t* __restrict__ gidx) {
  using K = Key<T>;
  constexpr int kBits = 8 * sizeof(K);
  __shared__ int hist[256];
  __shared__ int wa[kU][32], wq[kU][32];
  __shared__ K s_prefix, s_mask;
  __shared__ int s_remaining, s_done;
  __shared__ K skey[kSortCap];
  __shared__ uint32_t sidx[kSortCap];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
  const int nt = blockDim.x;
  const int kk = static_cast<int>(k), nn = static_cast<int>(n);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* p = x + row * n;
    if (tid == 0) s_prefix = 0, s_mask = 0, s_remaining = kk, s_done = 0;
    // Radix select: after the passes, the keys whose masked bits exceed s_prefix are winners and
    // s_remaining more are wanted among those whose masked bits equal it.
    for (int shift = kBits - 8; shift >= low_bit; shift -= 8) {
      for (int b = tid; b < 256; b += nt) hist[b] = 0;
      __syncthreads();
      const K prefix = s_prefix, mask = s_mask;
      // kU loads in flight per thread; lanes with the same digit add once (warp-aggregated).
      for (int64_t base = 0; base < nn; base += kU * nt) {
        K kv[kU];
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const int64_t i = base + u * nt + tid;
          kv[u] = i < nn ? order_key(ld(p[i])) : K(0);
        }
#pragma unroll
        for (int u = 0; u < kU; ++u) {
          const bool hit = base + u * nt + tid < nn && (kv[u] & mask) == prefix;
          if (!__any_sync(0xffffffffu, hit)) continue;  // the same in the whole warp
          const int digit = hit ? static_cast<int>(kv[u] >> shift) & 255 : 256;
          const unsigned same = __match_any_sync(0xffffffffu, digit);
          if (hit && lane == __ffs(same) - 1) atomicAdd(&hist[digit], __popc(same));
        }
      }
      __syncthreads();
      if (warp == 0) {  // the digit holding the want-th largest key: lane l owns bins 8l..8l+7
        const int want = s_remaining;
        int own = 0;
        for (int b = 0; b < 8; ++b) own += hist[lane * 8 + b];
        int suffix = own;  // over lanes >= lane, i.e. over higher digits
        for (int o = 1; o < 32; o <<= 1) {
          const int t = __shfl_down_sync(0xffffffffu, suffix, o);
          if (lane + o < 32) suffix += t;
        }
        int above = suffix - own;
        if (above < want && want <= suffix) {  // exactly one lane
          for (int b = 7; b >= 0; --b) {
            const int c = hist[lane * 8 + b];
            if (above + c >= want) {
              s_prefix = prefix | (static_cast<K>(lane * 8 + b) << shift);
              s_mask = mask | (static_cast<K>(255) << shift);
              s_remaining = want - above;
              s_done = c == want - above;  // the whole bucket is taken: no need to refine it
              break;
            }
            above += c;
          }
        }
      }
      __syncthreads();
      if (s_done) break;
    }
    const K prefix = s_prefix, mask = s_mask;
    const int eq_want = s_remaining, above_count = kk - eq_want;
    K* ok = gkeys ? gkeys + row * k : skey;
    uint32_t* oi = gkeys ? gidx + row * k : sidx;
    // Ordered compaction, a tile of nt elements at a time: winners above the k-th key fill
    // [0, above_count) and the first eq_want equal ones [above_count, k), each in index order.
    // A tile is kU sub-tiles of nt elements; sub-tile u holds elements base + u * nt + tid.
    const unsigned lt = (1u << lane) - 1u;
    int na = 0, nq = 0;
    for (int64_t base = 0; base < nn; base += kU * nt) {
      K kv[kU];
      unsigned ba[kU], bq[kU];
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const int64_t i = base + u * nt + tid;
        kv[u] = i < nn ? order_key(ld(p[i])) : K(0);
      }
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        const bool in = base + u * nt + tid < nn;
        ba[u] = __ballot_sync(0xffffffffu, in && (kv[u] & mask) > prefix);
        bq[u] = __ballot_sync(0xffffffffu, in && (kv[u] & mask) == prefix);
        if (lane == 0) wa[u][warp] = __popc(ba[u]), wq[u][warp] = __popc(bq[u]);
      }
      __syncthreads();
#pragma unroll
      for (int u = 0; u < kU; ++u) {
        // Per-warp counts scanned across the lanes of every warp: pa / pq count the sub-tile's
        // winners in earlier warps, ta / tq in all of them.
        const int ca = lane < nw ? wa[u][lane] : 0, cq = lane < nw ? wq[u][lane] : 0;
        int sa = ca, sq = cq;
        for (int o = 1; o < 32; o <<= 1) {
          const int xa = __shfl_up_sync(0xffffffffu, sa, o),
                    xq = __shfl_up_sync(0xffffffffu, sq, o);
          if (lane >= o) sa += xa, sq += xq;
        }
        const int pa = __shfl_sync(0xffffffffu, sa - ca, warp);
        const int pq = __shfl_sync(0xffffffffu, sq - cq, warp);
        const int ta = __shfl_sync(0xffffffffu, sa, 31), tq = __shfl_sync(0xffffffffu, sq, 31);
        const uint32_t i = static_cast<uint32_t>(base + u * nt + tid);
        if ((ba[u] >> lane) & 1u) {
          const int at = na + pa + __popc(ba[u] & lt);
          ok[at] = kv[u], oi[at] = i;
        }
        if ((bq[u] >> lane) & 1u) {
          const int r = nq + pq + __popc(bq[u] & lt);
          if (r < eq_want) ok[above_count + r] = kv[u], oi[above_count + r] = i;
        }
        na += ta, nq += tq;
      }
      __syncthreads();
      if (na == above_count && nq >= eq_want) break;  // the same in every thread
    }
    if (!gkeys) {
      // Bitonic sort of the winners by (key descending, index ascending), padded to a power of
      // two with entries that rank last (no value maps to key 0).
      int P = 1;
      while (P < kk) P <<= 1;
      for (int j = kk + tid; j < P; j += nt) skey[j] = 0, sidx[j] = 0xffffffffu;
      __syncthreads();
      for (int size = 2; size <= P; size <<= 1)
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
          for (int t = tid; t < P / 2; t += nt) {
            const int i = (t / stride) * 2 * stride + (t % stride), j = i + stride;
            const K ki = skey[i], kj = skey[j];
            const uint32_t ii = sidx[i], ij = sidx[j];
            const bool up = (i & size) == 0;
            if (up ? before(kj, ij, ki, ii) : before(ki, ii, kj, ij)) {
              skey[i] = kj, skey[j] = ki;
              sidx[i] = ij, sidx[j] = ii;
            }
          }
          __syncthreads();
        }
      for (int j = tid; j < kk; j += nt) {
        const uint32_t ix = sidx[j];
        values[row * k + j] = p[ix];
        indices[row * k + j] = static_cast<int64_t>(ix);
      }
    }
    __syncthreads();  // before the next row reuses the shared state
  }
}

__global__ void row_offsets_kernel(int* offsets, int64_t rows, int64_t k) {
  for (int64_t r = global_thread(); r <= rows; r += global_threads())
    offsets[r] = static_cast<int>(r * k);
}

template <class T>
__global__ void topk_output_kernel(const T* __restrict__ x, const uint32_t* __restrict__ sidx,
                                   int64_t total, int64_t n, int64_t k, T* __restrict__ values,
                                   int64_t* __restrict__ indices) {
  for (int64_t e = global_thread(); e < total; e += global_threads()) {
    const uint32_t ix = sidx[e];
    values[e] = x[(e / k) * n + ix];
    indices[e] = static_cast<int64_t>(ix);
  }
}

void topk_cuda(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  const char* op = "topk";
  const int64_t n = x.dim() ? x.shape().back() : 1, rows = n ? x.numel() / n : 0;
  if (k == 0 || rows == 0) return;
  MYRIAD_CHECK(n <= INT_MAX, op, ": the cuda kernel handles rows of at most ", INT_MAX,
               " elements, got ", x.desc());
  MYRIAD_CHECK(indices.dtype() == DType::I64, op, ": indices must be i64, got ", indices.desc());
  const int dev = values.device().index;
  const int threads = n <= 1024 ? 128 : n <= 8192 ? 256 : n <= 32768 ? 512 : kMaxThreads;
  dispatch_float(op, x.dtype(), [&](auto tag) {
    using T = decltype(tag);
    using K = Key<T>;
    const int low_bit = std::is_same_v<T, Bf16> ? 16 : 0;
    const unsigned grid = grid_for(rows, 1);
    if (k <= kSortCap) {
      launch(op, dev, grid, threads, &topk_kernel<T>, cptr<T>(x), rows, n, k, low_bit,
             mptr<T>(values), mptr<int64_t>(indices), static_cast<K*>(nullptr),
             static_cast<uint32_t*>(nullptr));
      return;
    }
    // Many winners: compact them to global memory, then sort each row's stably by key.
    const int64_t total = rows * k;
    MYRIAD_CHECK(total <= INT_MAX, op, ": the cuda kernel sorts at most ", INT_MAX,
                 " winners, got ", rows, " rows of k = ", k);
    const Device device = values.device();
    const DType kt = sizeof(K) == 4 ? DType::I32 : DType::I64;
    Tensor keys = Tensor::empty({total}, kt, device), keys_out = Tensor::empty({total}, kt, device);
    Tensor idx = Tensor::empty({total}, DType::I32, device);
    Tensor idx_out = Tensor::empty({total}, DType::I32, device);
    Tensor offsets = Tensor::empty({rows + 1}, DType::I32, device);
    launch(op, dev, grid, threads, &topk_kernel<T>, cptr<T>(x), rows, n, k, low_bit,
           mptr<T>(values), mptr<int64_t>(indices), mptr<K>(keys), mptr<uint32_t>(idx));
    launch(op, dev, grid_for(rows + 1), kThreads, &row_offsets_kernel, mptr<int>(offsets), rows, k);
    {
      DeviceGuard g(dev);
      cudaStream_t stream = current_stream(dev);
      const int* off = cptr<int>(offsets);
      size_t bytes = 0;
      CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
          nullptr, bytes, cptr<K>(keys), mptr<K>(keys_out), cptr<uint32_t>(idx),
          mptr<uint32_t>(idx_out), static_cast<int>(total), static_cast<int>(rows), off, off + 1,
          low_bit, static_cast<int>(8 * sizeof(K)), stream));
      Tensor tmp =
          Tensor::empty({std::max<int64_t>(1, static_cast<int64_t>(bytes))}, DType::U8, device);
      CUDA_CHECK(cub::DeviceSegmentedRadixSort::SortPairsDescending(
          tmp.data_ptr(), bytes, cptr<K>(keys), mptr<K>(keys_out), cptr<uint32_t>(idx),
          mptr<uint32_t>(idx_out), static_cast<int>(total), static_cast<int>(rows), off, off + 1,
          low_bit, static_cast<int>(8 * sizeof(K)), stream));
      CUDA_CHECK_LAUNCH(op);
    }
    launch(op, dev, grid_for(total), kThreads, &topk_output_kernel<T>, cptr<T>(x),
           cptr<uint32_t>(idx_out), total, n, k, mptr<T>(values), mptr<int64_t>(indices));
  });
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::topk_kernels, ops::Backend::CUDA, &topk_cuda);
}  // namespace myriad::gpu
