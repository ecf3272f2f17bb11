// The CPU GEMM kernel: oneDNN's matmul primitive, addressed through strides so transposed
// operands and broadcast (stride 0) batches need no copies. alpha is an output scale and beta a
// sum post-op. Primitives are created once per (shape, strides, dtype, flags, alpha, beta) and
// cached, so a repeated call costs a hash lookup on top of oneDNN's own execute. A grouped
// product (a MoE expert's rows) takes a primitive created with runtime m and k instead: its row
// count changes at every step, and creating a primitive per count cost 0.65 ms each for AMX bf16
// (25x the product itself) and was a fifth of a bf16 training step at the 30M shape.
//
// Up to 16 rows of A against B stored [n, k] (decode: a token per running sequence against an
// nn.Linear weight) take a streaming kernel instead (few_rows below): it reads B once, row by
// row, in one parallel region, and gives each row the same bits at any batch size. oneDNN's matmul
// at M = 1 read weights from DRAM at ~10 GB/s on one core here, the half of what this kernel
// reaches (bench_gemm's 1x65536x512^T row).
#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <exception>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <limits>
#include <memory>
#include <mutex>
#include <oneapi/dnnl/dnnl.hpp>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "backend/cpu/cpu.h"
#include "ops/matmul.h"
#include "ops/quant.h"

namespace myriad::cpu {
namespace {
using ops::GemmArgs;
using dt = dnnl::memory::data_type;
using dims = dnnl::memory::dims;

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
// CPU streams execute synchronously in the calling thread and keep no state between calls,
// so one serves every thread.
dnnl::stream& stream() {
  static dnnl::stream s(engine());
  return s;
}

using Key = std::array<int64_t, 15>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    uint64_t h = 1469598103934665603ull;
    for (int64_t v : k) h = (h ^ static_cast<uint64_t>(v)) * 1099511628211ull;
    return h;
  }
};

// any_size: m and k are runtime dimensions (kAnySize in the key, DNNL_RUNTIME_DIM_VAL in the
// primitive), so one primitive serves every row count of a grouped product.
constexpr int64_t kAnySize = -1;

Key key_of(const GemmArgs& g, bool any_size) {
  const int64_t m = any_size ? kAnySize : g.m, k_ = any_size ? kAnySize : g.k;
  Key k = {g.batch, m, g.n, k_, g.trans_a, g.trans_b, g.lda, g.ldb, g.ldc};
  k[9] = g.stride_a, k[10] = g.stride_b, k[11] = g.stride_c;
  k[12] = std::bit_cast<int32_t>(g.alpha), k[13] = std::bit_cast<int32_t>(g.beta);
  k[14] = static_cast<int64_t>(g.dtype);
  return k;
}

// The memory descriptor of op(X) as a rows x cols matrix (per batch): row-major with leading
// dimension ld, or stored transposed. A stride-0 batch becomes a batch of 1 that oneDNN
// broadcasts.
dnnl::memory::desc operand_md(int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t ld,
                              int64_t bstride, dt type) {
  const int64_t rs = trans ? 1 : ld, cs = trans ? ld : 1;
  if (batch == 1) return dnnl::memory::desc(dims{rows, cols}, type, dims{rs, cs});
  return dnnl::memory::desc(dims{bstride == 0 ? 1 : batch, rows, cols}, type,
                            dims{bstride == 0 ? rows * cols : bstride, rs, cs});
}

struct Entry {
  dnnl::matmul prim;
  dnnl::memory::desc a, b, c, scratch;
};

// The operands' memory descriptors; with any_size, m and k are runtime dimensions.
std::array<dnnl::memory::desc, 3> operand_mds(const GemmArgs& g, bool any_size) {
  const dt type = g.dtype == DType::F32 ? dt::f32 : dt::bf16;
  const int64_t m = any_size ? DNNL_RUNTIME_DIM_VAL : g.m;
  const int64_t k = any_size ? DNNL_RUNTIME_DIM_VAL : g.k;
  return {operand_md(g.batch, m, k, g.trans_a, g.lda, g.stride_a, type),
          operand_md(g.batch, k, g.n, g.trans_b, g.ldb, g.stride_b, type),
          operand_md(g.batch, m, g.n, false, g.ldc, g.stride_c, type)};
}

std::shared_ptr<const Entry> create(const GemmArgs& g, bool any_size) {
  const auto [a, b, c] = operand_mds(g, any_size);
  dnnl::primitive_attr attr;
  // Each calling thread passes its own scratchpad (thread_scratch below): with oneDNN's own
  // (library) scratchpad, products run at once from the threads of one parallel region
  // (grouped_gemm_cpu) corrupted each other's partial sums.
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (g.alpha != 1.0f) attr.set_output_scales(0, {g.alpha});
  if (g.beta != 0.0f) {
    dnnl::post_ops po;
    po.append_sum(g.beta);
    attr.set_post_ops(po);
  }
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), attr, engine());
  return std::make_shared<const Entry>(Entry{dnnl::matmul(pd), a, b, c, pd.scratchpad_desc()});
}

// Both caches are simply emptied when full: shapes in a training run are few, and a miss only
// costs a creation (which oneDNN's own primitive cache often serves).
constexpr size_t kMaxEntries = 4096;

// The process-wide primitives, shared by all threads.
std::shared_ptr<const Entry> shared_entry(const Key& key, const GemmArgs& g, bool any_size) {
  static std::mutex mu;
  static std::unordered_map<Key, std::shared_ptr<const Entry>, KeyHash> map;
  {
    std::lock_guard lock(mu);
    auto it = map.find(key);
    if (it != map.end()) return it->second;
  }
  auto e = create(g, any_size);  // outside the lock: creation can take a while
  std::lock_guard lock(mu);
  if (map.size() >= kMaxEntries) map.clear();
  return map.emplace(key, e).first->second;
}

// Per thread: the primitives this thread ran, with memory objects whose data handles are
// rebound on each call, so the steady state takes no lock and allocates nothing.
struct Bound {
  std::shared_ptr<const Entry> e;
  std::unordered_map<int, dnnl::memory> args;
};

Bound& bound_for(const GemmArgs& g, bool any_size) {
  thread_local std::unordered_map<Key, Bound, KeyHash> local;
  Key key = key_of(g, any_size);
  auto it = local.find(key);
  if (it != local.end()) return it->second;
  if (local.size() >= kMaxEntries) local.clear();
  Bound b{shared_entry(key, g, any_size), {}};
  b.args = {{DNNL_ARG_SCRATCHPAD, dnnl::memory(b.e->scratch, engine(), DNNL_MEMORY_NONE)}};
  if (!any_size)  // any size: onednn() makes the operands' memory objects at each call
    b.args.insert({{DNNL_ARG_SRC, dnnl::memory(b.e->a, engine(), DNNL_MEMORY_NONE)},
                   {DNNL_ARG_WEIGHTS, dnnl::memory(b.e->b, engine(), DNNL_MEMORY_NONE)},
                   {DNNL_ARG_DST, dnnl::memory(b.e->c, engine(), DNNL_MEMORY_NONE)}});
  return local.emplace(key, std::move(b)).first->second;
}

// K = 0: the product is empty, C = beta * C.
void scale_c(const GemmArgs& g) {
  for (int64_t bi = 0; bi < g.batch; ++bi)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        int64_t o = bi * g.stride_c + i * g.ldc + j;
        if (g.dtype == DType::F32) {
          float* c = static_cast<float*>(g.c) + o;
          *c = g.beta == 0.0f ? 0.0f : g.beta * *c;
        } else {
          uint16_t* c = static_cast<uint16_t*>(g.c) + o;
          *c = bf16_store(g.beta == 0.0f ? 0.0f : g.beta * bf16_load(*c));
        }
      }
}

// ---- a few rows of A against B stored [n, k] ----
// Decode: each running sequence contributes one row of A. Every C[r, j] is the same sum in the
// same order whatever m is and wherever row r sits, so a sequence decoded in a batch gets bit
// for bit the logits it gets alone (tests/infer BatchedDecode).
constexpr int64_t kMaxRows = ops::kFewRows;  // larger products (prefill) go to oneDNN
// How far ahead of the loads each row of B is prefetched, in bytes (8 KiB: 2048 f32, 4096 bf16,
// 8192 int8 codes, 16384 int4). The kernels read B in tiles of 4 rows, so with a model's small
// rows (512 elements: 1-2 KiB) a prefetch 2 KiB ahead fell in the tile's own next row, already
// being read; 8 KiB ahead reaches the tiles after it. Batch-1 decode of the three 68-98M models
// of scripts/bench_vs_llamacpp.sh against the earlier distances (2 KiB f32, 1 KiB bf16, 512
// bytes int8 and int4 codes), 3 rounds alternating: bf16 1.14-1.35x, f32 1.00-1.20x, int8
// 1.06-1.21x, w8a8 1.08-1.13x, int4 0.96-1.10x.
constexpr int64_t kAhead = 8 << 10;
constexpr int kLanes = 16;  // f32 partial sums per product (one zmm, two ymm)
constexpr int kTile = 4;    // tiles of up to 4 rows of B x 4 rows of A (16 accumulators)

inline void store(float* p, float v, float beta) {
  *p = beta == 0.0f ? v : v + beta * *p;
}
inline void store(uint16_t* p, float v, float beta) {
  *p = bf16_store(beta == 0.0f ? v : v + beta * bf16_load(*p));
}

// Loads of W f32 lanes (cpu.h's Lanes) write through a reference: a function returning a vector
// would change the ABI between the clones.
template <int W>
inline void load_lanes(typename Lanes<W>::F& v, const float* p) {
  std::memcpy(&v, p, sizeof v);
}
template <int W>
inline void load_lanes(typename Lanes<W>::F& v, const uint16_t* p) {
  using U = typename Lanes<W>::U;
  typename Lanes<W>::H h;
  std::memcpy(&h, p, sizeof h);
  const U u = __builtin_convertvector(h, U) << 16;
  std::memcpy(&v, &u, sizeof v);
}
// int8 codes (ops/quant.h), converted exactly; the caller multiplies by the group's scale. Only
// the generic int8 path loads them so (sanitizer builds, CPUs without AVX2, a forced width the CPU
// lacks); the cloned builds run the intrinsic loops below.
template <int W>
inline void load_lanes(typename Lanes<W>::F& v, const int8_t* p) {
  for (int l = 0; l < W; ++l) v[l] = static_cast<float>(p[l]);
}
// int4 codes (ops/quant.h): a group of 32 elements is 16 bytes, elements 0-15 in the low nibbles
// and 16-31 in the high ones, so the 16 elements a step reads (i a multiple of 16) are one
// nibble of the 16 bytes at (i / 32)·16. A row pointer counts bytes.
struct Int4 {
  uint8_t byte;
};
inline const uint8_t* nibble_bytes(const Int4* row, int64_t i) {
  return &row[i / ops::kQuantGroup * (ops::kQuantGroup / 2)].byte;
}
template <int W>
inline void load_nibbles(typename Lanes<W>::F* v, const Int4* row, int64_t i) {
  const uint8_t* p = nibble_bytes(row, i);
  const int shift = i % ops::kQuantGroup == 0 ? 0 : 4;
  for (int q = 0; q < kLanes / W; ++q)
    for (int l = 0; l < W; ++l) v[q][l] = static_cast<float>(((p[q * W + l] >> shift) & 15) - 8);
}
template <class T>
constexpr bool kCodes = std::is_same_v<T, int8_t> || std::is_same_v<T, Int4>;
// kLanes elements from p as kLanes / W vectors; the last n < kLanes elements zero-padded.
template <int W, class T>
inline void load16(typename Lanes<W>::F* v, const T* p) {
#pragma GCC unroll 2
  for (int q = 0; q < kLanes / W; ++q) load_lanes<W>(v[q], p + q * W);
}
template <int W, class T>
inline void load_tail(typename Lanes<W>::F* v, const T* p, int64_t n) {
  T buf[kLanes] = {};
  std::memcpy(buf, p, static_cast<size_t>(n) * sizeof(T));
  load16<W>(v, buf);
}

// out[jj * ldo + r] = x[r] . w[jj] for a tile of J rows of B and R rows of A: lane l of the
// accumulators (16 of them, as kLanes / W vectors of W lanes) sums the products i = l mod 16 in
// order, with the same vector expression in every tile shape and vector width (so the same
// fused multiply-adds), then the 16 lanes are added in a fixed order. The tile and the width
// change which loads are shared, never a sum. int8 and int4 rows of B (k a multiple of 32) are
// widened and multiplied by their group's scale sc[jj][i / 32] in registers: the f32 values
// dequantize gives, so the same sums as the f32 kernel on the dequantized weight.
template <class T, int J, int R, int W>
MYRIAD_CPU_CLONES void dots(const float* const* x, const T* const* w, const float* const* sc,
                            int64_t k, float* out) {
  using V = typename Lanes<W>::F;
  constexpr int N = kLanes / W;
  // Every loop over J, R and N is unrolled: GCC 12 otherwise kept them as loops over stack arrays,
  // so each fused multiply-add loaded and stored its accumulator (16 rows ran at 14% of peak).
  V acc[J][R][N] = {};
  int64_t i = 0;
  V wv[J][N] = {}, xv[N] = {};
  for (; i + kLanes <= k; i += kLanes) {
    // The tile's rows of B, and each row's prefetch kAhead bytes ahead: the hardware prefetcher
    // alone left a core's single-row stream at 15-19 GB/s from a 128 MiB weight (18-21 with a
    // prefetch 2 KiB ahead), and decode 5-7% slower.
    if constexpr (std::is_same_v<T, Int4>) {
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) load_nibbles<W>(wv[jj], w[jj], i);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) __builtin_prefetch(nibble_bytes(w[jj], i) + kAhead, 0, 3);
    } else {
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) load16<W>(wv[jj], w[jj] + i);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj)
        __builtin_prefetch(w[jj] + i + kAhead / int64_t{sizeof(T)}, 0, 3);
    }
    if constexpr (kCodes<T>) {
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 2
        for (int q = 0; q < N; ++q) wv[jj][q] *= sc[jj][i / ops::kQuantGroup];
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      load16<W>(xv, x[r] + i);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 2
        for (int q = 0; q < N; ++q) acc[jj][r][q] += xv[q] * wv[jj][q];
    }
  }
  if constexpr (!kCodes<T>) {  // (codes have none: k is a multiple of 32)
    if (i < k) {
      for (int jj = 0; jj < J; ++jj) load_tail<W>(wv[jj], w[jj] + i, k - i);
      for (int r = 0; r < R; ++r) {
        load_tail<W>(xv, x[r] + i, k - i);
        for (int jj = 0; jj < J; ++jj)
          for (int q = 0; q < N; ++q) acc[jj][r][q] += xv[q] * wv[jj][q];
      }
    }
  }
  // The 16 lanes in order (vector q's lanes are lanes q W .. q W + W - 1).
  for (int jj = 0; jj < J; ++jj)
    for (int r = 0; r < R; ++r) {
      float s = 0;
      for (int q = 0; q < N; ++q)
        for (int l = 0; l < W; ++l) s += acc[jj][r][q][l];
      out[jj * kTile + r] = s;
    }
}

template <class T, int W, size_t... I>
constexpr auto dots_table(std::index_sequence<I...>) {
  return std::array{
      &dots<T, static_cast<int>(I / kTile + 1), static_cast<int>(I % kTile + 1), W>...};
}

// The intrinsic kernels below exist only where the kernels are cloned (cpu.h).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define MYRIAD_CODE_INTRINSICS 1
// Whether the CPU runs the int8-activation kernels' AVX512-VNNI forms (read once).
bool has_vnni() {
  static const bool v = __builtin_cpu_supports("avx512vnni") &&
                        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
  return v;
}
#endif

// ---- int8 activations (GemmArgs::a_bits 8: ops/quant.h's "int8 activations") ----
// A block of 64 elements of a row of A quantized for the kernels: the codes (zero past k) and,
// for each of its 16 lanes of 4 elements (lanes 0-7 the block's first group of 32, 8-15 its
// second), the group's scale (0 past k) and -128 times the lane's sum of codes (the VNNI kernel's
// offset).
struct QBlock {
  int8_t q[64];
  int32_t corr[16];
  float s[16];
};
// The rows' blocks are stored block-major, [block][row]: a tile's rows are consecutive, so the
// kernels reach row r's block b as first[b * stride + r] from the tile's first row alone (one
// pointer instead of three per row: with twelve, the 4 x 4 tile ran out of general registers and
// reloaded them from the stack every block).
struct QRow {
  const QBlock* first;  // the row's block 0
  int64_t stride;       // blocks of a row are stride apart (the row count)
};
struct QRows {
  int64_t m = 0, blocks = 0;
  std::vector<QBlock> data;
  QRow at(int64_t r) const { return {data.data() + r, m}; }
};
// One block of a row (x at its first element, `groups` 1 or 2 groups of 32 in it) by the int8
// rule, as the reference's quantize_row: codes, scales, offsets. The largest |x| is exact in any
// order, and round_half_even as the reference's nearbyint (default rounding, |v| <= 127) is adding
// and subtracting 1.5 · 2^23.
void quantize_block(const float* x, int groups, QBlock& blk) {
  constexpr int64_t G = ops::kQuantGroup;
  for (int h = 0; h < groups; ++h) {
    float amax = 0;
    for (int64_t e = h * G; e < (h + 1) * G; ++e)
      if (std::fabs(x[e]) > amax || std::isnan(x[e]))  // (a NaN sticks)
        amax = std::isnan(amax) ? amax : std::fabs(x[e]);
    const float xs = amax / 127.0f;
    for (int l = 0; l < 8; ++l) blk.s[h * 8 + l] = xs;
    if (xs == 0.0f || !std::isfinite(xs)) continue;  // codes 0; a non-finite scale gives NaN
    for (int64_t e = h * G; e < (h + 1) * G; ++e) {
      const float v = std::clamp(x[e] / xs, -127.0f, 127.0f);
      blk.q[e] = static_cast<int8_t>((v + 0x1.8p23f) - 0x1.8p23f);
    }
  }
  for (int l = 0; l < 16; ++l)
    blk.corr[l] = -128 * (blk.q[4 * l] + blk.q[4 * l + 1] + blk.q[4 * l + 2] + blk.q[4 * l + 3]);
}

#if defined(MYRIAD_CODE_INTRINSICS)
void quantize_block_avx512(const float* x, int groups, QBlock& blk);  // (below)
#endif

// m rows of x (ldx apart, k a multiple of 32) by ops/quant.h's rule, as its reference does.
QRows quantize_rows(const float* x, int64_t ldx, int64_t m, int64_t k) {
  constexpr int64_t G = ops::kQuantGroup;
  QRows r;
  r.m = m, r.blocks = (k + 63) / 64;
  r.data.assign(static_cast<size_t>(m * r.blocks), QBlock{});
  for (int64_t i = 0; i < m; ++i)
    for (int64_t b = 0; b < r.blocks; ++b) {
      const int groups = static_cast<int>(std::min<int64_t>(2, k / G - 2 * b));
      QBlock& blk = r.data[static_cast<size_t>(b * m + i)];
      const float* xb = x + i * ldx + b * 2 * G;
#if defined(MYRIAD_CODE_INTRINSICS)
      if (has_vnni()) {
        quantize_block_avx512(xb, groups, blk);
        continue;
      }
#endif
      quantize_block(xb, groups, blk);
    }
  return r;
}

// out[jj * kTile + r] = x[r] . w[jj] by the definition's lanes in plain code (sanitizer builds,
// CPUs without AVX2): exact integer sums of four, then one fused multiply-add per lane and block.
template <int J, int R>
void dots_q8(const QRow* x, const int8_t* const* w, const float* const* sc, int64_t k, float* out) {
  const int64_t groups = k / ops::kQuantGroup;
  for (int jj = 0; jj < J; ++jj)
    for (int r = 0; r < R; ++r) {
      float acc[kLanes] = {};
      for (int64_t b = 0; b < (k + 63) / 64; ++b)
        for (int l = 0; l < kLanes; ++l) {
          const int64_t g = 2 * b + l / 8, e0 = 64 * b + 4 * l;
          int p = 0;
          float s = 0;
          const QBlock& xb = x[r].first[b * x[r].stride];
          if (g < groups) {
            for (int64_t e = e0; e < e0 + 4; ++e) p += xb.q[e - 64 * b] * w[jj][e];
            s = xb.s[l] * sc[jj][g];
          }
          acc[l] = std::fma(static_cast<float>(p), s, acc[l]);
        }
      float y = 0;
      for (float a : acc) y += a;
      out[jj * kTile + r] = y;
    }
}
template <size_t... I>
constexpr auto q8_table(std::index_sequence<I...>) {
  return std::array{&dots_q8<static_cast<int>(I / kTile + 1), static_cast<int>(I % kTile + 1)>...};
}

// Only where the kernels are cloned (cpu.h): the intrinsics fuse multiply-adds as the AVX2 and
// AVX-512 clones do; the sanitizer builds run the baseline code, which does not.
#if defined(MYRIAD_CODE_INTRINSICS)
// The intrinsic kernels' shared parts: acc[jj][r] += x[r][i, i + 16) · wv[jj] for every row of A
// and B (one 16-lane vector, or two 8-lane halves), and the 16 lanes of each accumulator summed
// in order into out.
template <int J, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void fma_rows_avx2(
    __m256 (&acc)[J][R][2], const float* const* x, int64_t i, const __m256 (&wv)[J][2]) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int q = 0; q < 2; ++q) {
      const __m256 xv = _mm256_loadu_ps(x[r] + i + 8 * q);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) acc[jj][r][q] = _mm256_fmadd_ps(xv, wv[jj][q], acc[jj][r][q]);
    }
}
template <int J, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void zero_acc_avx2(
    __m256 (&acc)[J][R][2]) {
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[jj][r][0] = acc[jj][r][1] = _mm256_setzero_ps();
}
template <int J, int R>
__attribute__((target("avx512f"), always_inline)) inline void zero_acc_avx512(__m512 (&acc)[J][R]) {
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) acc[jj][r] = _mm512_setzero_ps();
}
template <int J, int R>
__attribute__((target("avx512f"), always_inline)) inline void fma_rows_avx512(
    __m512 (&acc)[J][R], const float* const* x, int64_t i, const __m512 (&wv)[J]) {
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m512 xv = _mm512_loadu_ps(x[r] + i);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) acc[jj][r] = _mm512_fmadd_ps(xv, wv[jj], acc[jj][r]);
  }
}
template <int J, int R>
__attribute__((target("avx2,fma"), always_inline)) inline void sum_lanes_avx2(
    const __m256 (&acc)[J][R][2], float* out) {
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      float lanes[kLanes], s = 0;
      _mm256_storeu_ps(lanes, acc[jj][r][0]);
      _mm256_storeu_ps(lanes + 8, acc[jj][r][1]);
      for (int l = 0; l < kLanes; ++l) s += lanes[l];
      out[jj * kTile + r] = s;
    }
}
template <int J, int R>
__attribute__((target("avx512f"), always_inline)) inline void sum_lanes_avx512(
    const __m512 (&acc)[J][R], float* out) {
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj)
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      float lanes[kLanes], s = 0;
      _mm512_storeu_ps(lanes, acc[jj][r]);
      for (int l = 0; l < kLanes; ++l) s += lanes[l];
      out[jj * kTile + r] = s;
    }
}

// dots for int8 codes with the sign extension as one load-and-widen instruction per vector
// (vpmovsxbd): GCC 12 widens int8 vector-extension lanes through int16 with 13 shuffles per 16
// codes, which bounded the kernel at ~9 GB/s of codes on two cores. The same lanes, products
// and fused multiply-adds as dots<int8_t, J, R, W> (W = 8 and 16), so the same bits.
template <int J, int R>
__attribute__((target("avx2,fma"))) void dots_codes_avx2(const float* const* x,
                                                         const int8_t* const* w,
                                                         const float* const* sc, int64_t k,
                                                         float* out) {
  __m256 acc[J][R][2];
  zero_acc_avx2<J, R>(acc);
  for (int64_t i = 0; i + kLanes <= k; i += kLanes) {
    __m256 wv[J][2];
    if (i % 64 == 0)
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) __builtin_prefetch(w[jj] + i + kAhead, 0, 3);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      const __m256 s = _mm256_set1_ps(sc[jj][i / ops::kQuantGroup]);
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(w[jj] + i + 8 * q));
        wv[jj][q] = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
      }
    }
    fma_rows_avx2<J, R>(acc, x, i, wv);
  }
  sum_lanes_avx2<J, R>(acc, out);
}

// (GCC 12's avx512fintrin.h reads an undefined vector inside _mm512_cvtepi32_ps's masked form.)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
template <int J, int R>
__attribute__((target("avx512f"))) void dots_codes_avx512(const float* const* x,
                                                          const int8_t* const* w,
                                                          const float* const* sc, int64_t k,
                                                          float* out) {
  __m512 acc[J][R];
  zero_acc_avx512<J, R>(acc);
  for (int64_t i = 0; i + kLanes <= k; i += kLanes) {
    __m512 wv[J];
    if (i % 64 == 0)  // a cache line of codes, prefetched kAhead bytes ahead as the f32 rows'
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) __builtin_prefetch(w[jj] + i + kAhead, 0, 3);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(w[jj] + i));
      wv[jj] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)),
                             _mm512_set1_ps(sc[jj][i / ops::kQuantGroup]));
    }
    fma_rows_avx512<J, R>(acc, x, i, wv);
  }
  sum_lanes_avx512<J, R>(acc, out);
}

// The bf16 kernels the cloned builds run (AVX2 and AVX-512). B's rows are read as 32-bit words,
// each a pair of bf16 elements: the pair's high element is the word with its low half cleared,
// its low element the word shifted left by 16, so one and or one shift per 16 weights and no
// shuffle. (Widening 16 elements at a time to the i mod 16 lanes took a load-and-zero-extend, a
// shuffle-port instruction, and a shift, and as GCC 12 compiles vector extensions four shuffles:
// the shuffle port bounded batch-1 bf16 decode.) So lane l of the 16 sums elements 2l + 1 and then
// 2l of each block of 32 (VDPBF16PS's order), and the rows of A come in the matching layout: each
// block of 32 as its 16 odd elements, then its 16 even ones, zero-padded to a multiple of 32
// (few_rows writes them so when bf16_pairs()). Both widths add the same products in the same
// order, so the same bits; the generic kernel (sanitizer builds, CPUs without AVX2) keeps the
// i mod 16 lanes.
template <int J, int R>
__attribute__((target("avx512f"))) void dots_bf16_pairs_avx512(const float* const* x,
                                                               const uint16_t* const* w,
                                                               const float* const*, int64_t k,
                                                               float* out) {
  __m512 acc[J][R];
  zero_acc_avx512<J, R>(acc);
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t i = 0; i < k; i += 32) {
    __m512 wo[J], we[J];
    if (i + 32 <= k) {
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) {
        __builtin_prefetch(w[jj] + i + kAhead / 2, 0, 3);
        const __m512i v = _mm512_loadu_si512(w[jj] + i);
        wo[jj] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        we[jj] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      }
    } else {  // the last k - i < 32 elements, zero-padded
      for (int jj = 0; jj < J; ++jj) {
        uint16_t t[32] = {};
        std::memcpy(t, w[jj] + i, static_cast<size_t>(k - i) * sizeof(uint16_t));
        const __m512i v = _mm512_loadu_si512(t);
        wo[jj] = _mm512_castsi512_ps(_mm512_and_si512(v, hi));
        we[jj] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m512 xo = _mm512_loadu_ps(x[r] + i), xe = _mm512_loadu_ps(x[r] + i + 16);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) {
        acc[jj][r] = _mm512_fmadd_ps(xo, wo[jj], acc[jj][r]);
        acc[jj][r] = _mm512_fmadd_ps(xe, we[jj], acc[jj][r]);
      }
    }
  }
  sum_lanes_avx512<J, R>(acc, out);
}
// Half q of the 16 lanes: lane l' sums elements 16q + 2l' + 1, then 16q + 2l'.
template <int J, int R>
__attribute__((target("avx2,fma"))) void dots_bf16_pairs_avx2(const float* const* x,
                                                              const uint16_t* const* w,
                                                              const float* const*, int64_t k,
                                                              float* out) {
  __m256 acc[J][R][2];
  zero_acc_avx2<J, R>(acc);
  const __m256i hi = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  for (int64_t i = 0; i < k; i += 32) {
    __m256 wo[J][2], we[J][2];
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      uint16_t t[32];
      const uint16_t* p = w[jj] + i;
      if (i + 32 <= k) {
        __builtin_prefetch(w[jj] + i + kAhead / 2, 0, 3);
      } else {  // the last k - i < 32 elements, zero-padded
        std::fill(t, t + 32, uint16_t{0});
        std::memcpy(t, p, static_cast<size_t>(k - i) * sizeof(uint16_t));
        p = t;
      }
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16 * q));
        wo[jj][q] = _mm256_castsi256_ps(_mm256_and_si256(v, hi));
        we[jj][q] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        const __m256 xo = _mm256_loadu_ps(x[r] + i + 8 * q);
        const __m256 xe = _mm256_loadu_ps(x[r] + i + 16 + 8 * q);
#pragma GCC unroll 4
        for (int jj = 0; jj < J; ++jj) {
          acc[jj][r][q] = _mm256_fmadd_ps(xo, wo[jj][q], acc[jj][r][q]);
          acc[jj][r][q] = _mm256_fmadd_ps(xe, we[jj][q], acc[jj][r][q]);
        }
      }
  }
  sum_lanes_avx2<J, R>(acc, out);
}

// dots<Int4, J, R, 16> a group (32 codes, 16 bytes) per step: one load and widening per row of B
// gives both halves of the group, whose weights are looked up in the group's table of the 16
// values float(q - 8)·scale (vpermps reads the low 4 bits of each lane: the low nibble as it is,
// the high one after a shift). The values dequantize gives; the two halves' multiply-adds run in
// the generic kernel's order (elements 0-15, then 16-31), so the same bits.
template <int J, int R>
__attribute__((target("avx512f"))) void dots_nibbles_avx512(const float* const* x,
                                                            const Int4* const* w,
                                                            const float* const* sc, int64_t k,
                                                            float* out) {
  constexpr int64_t G = ops::kQuantGroup;
  __m512 acc[J][R];
  zero_acc_avx512<J, R>(acc);
  const __m512 codes = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t i = 0; i + G <= k; i += G) {
    __m512 lo[J], hi[J];
    if (i % 128 == 0)  // a cache line of codes, kAhead bytes ahead
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) __builtin_prefetch(nibble_bytes(w[jj], i) + kAhead, 0, 3);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(nibble_bytes(w[jj], i)));
      const __m512i c = _mm512_cvtepu8_epi32(b);
      const __m512 table = _mm512_mul_ps(codes, _mm512_set1_ps(sc[jj][i / G]));
      lo[jj] = _mm512_permutexvar_ps(c, table);
      hi[jj] = _mm512_permutexvar_ps(_mm512_srli_epi32(c, 4), table);
    }
    fma_rows_avx512<J, R>(acc, x, i, lo);
    fma_rows_avx512<J, R>(acc, x, i + 16, hi);
  }
  sum_lanes_avx512<J, R>(acc, out);
}

// dots_q8 with AVX512-VNNI, a block of 64 per step: the weight codes plus 128 (the sign bit
// flipped) as vpdpbusd's unsigned operand against the activation codes, from the accumulator
// -128 times the lane's activation sum, give each lane's exact sum of four products in one
// instruction; then the lane's scale (activation scale times the group's weight scale, the pair
// of weight scales spread over the two halves) and one fused multiply-add, as dots_q8.
template <int J, int R, bool Half>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"), always_inline)) inline void
q8_block_avx512(__m512 (&acc)[J][R], const QRow* x, const int8_t* const* w, const float* const* sc,
                int64_t b) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i pair = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  __m512i wv[J];
  __m512 ws[J];
#pragma GCC unroll 4
  for (int jj = 0; jj < J; ++jj) {
    __builtin_prefetch(w[jj] + 64 * b + kAhead, 0, 3);
    // The last block of an odd group count holds one group: the rest of its codes read as 0 (the
    // activations' codes and scales there are 0 too).
    const __m512i c = Half ? _mm512_maskz_loadu_epi8(0xffffffffull, w[jj] + 64 * b)
                           : _mm512_loadu_si512(w[jj] + 64 * b);
    wv[jj] = _mm512_xor_si512(c, flip);
    const __m128 two =
        Half ? _mm_maskz_loadu_ps(1, sc[jj] + 2 * b)
             : _mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(sc[jj] + 2 * b)));
    ws[jj] = _mm512_permutexvar_ps(pair, _mm512_castps128_ps512(two));
  }
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const QBlock& xb = x[0].first[b * x[0].stride + r];  // (a tile's rows are consecutive)
    const __m512i xq = _mm512_loadu_si512(xb.q);
    const __m512i corr = _mm512_loadu_si512(xb.corr);
    const __m512 xs = _mm512_loadu_ps(xb.s);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      const __m512i p = _mm512_dpbusd_epi32(corr, wv[jj], xq);
      acc[jj][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(p), _mm512_mul_ps(xs, ws[jj]), acc[jj][r]);
    }
  }
}
template <int J, int R>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void dots_q8_avx512(
    const QRow* x, const int8_t* const* w, const float* const* sc, int64_t k, float* out) {
  __m512 acc[J][R];
  zero_acc_avx512<J, R>(acc);
  const int64_t full = k / 64;
  for (int64_t b = 0; b < full; ++b) q8_block_avx512<J, R, false>(acc, x, w, sc, b);
  if (k % 64) q8_block_avx512<J, R, true>(acc, x, w, sc, full);
  sum_lanes_avx512<J, R>(acc, out);
}

// quantize_block with AVX-512 (the same codes, scales and offsets): a group is two vectors; a
// non-finite element shows as x - x != 0; the offsets are one vpdpbusd of ones against the codes.
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void quantize_block_avx512(
    const float* x, int groups, QBlock& blk) {
  const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f),
               magic = _mm512_set1_ps(0x1.8p23f), zero = _mm512_setzero_ps();
  for (int h = 0; h < groups; ++h) {
    const __m512 a = _mm512_loadu_ps(x + 32 * h), b = _mm512_loadu_ps(x + 32 * h + 16);
    const __mmask16 bad = _mm512_cmp_ps_mask(_mm512_sub_ps(a, a), zero, _CMP_NEQ_UQ) |
                          _mm512_cmp_ps_mask(_mm512_sub_ps(b, b), zero, _CMP_NEQ_UQ);
    const float xs =
        bad ? std::numeric_limits<float>::quiet_NaN()
            : _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a), _mm512_abs_ps(b))) / 127.0f;
    _mm256_storeu_ps(blk.s + 8 * h, _mm256_set1_ps(xs));
    if (xs == 0.0f || !std::isfinite(xs)) continue;  // codes 0
    const __m512 d = _mm512_set1_ps(xs);
    const __m512 v[2] = {a, b};
    for (int u = 0; u < 2; ++u) {
      const __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(v[u], d), lo), hi);
      const __m512i i = _mm512_cvttps_epi32(_mm512_sub_ps(_mm512_add_ps(c, magic), magic));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(blk.q + 32 * h + 16 * u),
                       _mm512_cvtepi32_epi8(i));
    }
  }
  const __m512i sum =
      _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), _mm512_loadu_si512(blk.q));
  _mm512_storeu_si512(blk.corr, _mm512_mullo_epi32(sum, _mm512_set1_epi32(-128)));
}

#pragma GCC diagnostic pop

// dots_q8 on AVX2, a group of 32 per step (lanes 0-7 or 8-15 of its block): |w| times x with w's
// sign (vpmaddubsw, pairs of at most 2 · 127 · 127, no saturation) and the pairs added
// (vpmaddwd) give the lanes' exact sums of four, then as dots_q8. A missing last group adds
// nothing, where dots_q8 adds fma(0, 0, acc): the same, as no lane sum is ever -0.
template <int J, int R>
__attribute__((target("avx2,fma"))) void dots_q8_avx2(const QRow* x, const int8_t* const* w,
                                                      const float* const* sc, int64_t k,
                                                      float* out) {
  constexpr int64_t G = ops::kQuantGroup;
  __m256 acc[J][R][2];
  zero_acc_avx2<J, R>(acc);
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < k / G; ++g) {
    const int64_t e = g * G;
    const int h = static_cast<int>(g % 2);
    __m256i wv[J], aw[J];
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      if (h == 0) __builtin_prefetch(w[jj] + e + kAhead, 0, 3);
      wv[jj] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[jj] + e));
      aw[jj] = _mm256_sign_epi8(wv[jj], wv[jj]);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const QBlock& xb = x[0].first[g / 2 * x[0].stride + r];  // (a tile's rows are consecutive)
      const __m256i xq = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb.q + 32 * h));
      const __m256 xs = _mm256_loadu_ps(xb.s + 8 * h);
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) {
        const __m256i p =
            _mm256_madd_epi16(_mm256_maddubs_epi16(aw[jj], _mm256_sign_epi8(xq, wv[jj])), ones);
        acc[jj][r][h] = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(p), _mm256_mul_ps(xs, _mm256_set1_ps(sc[jj][g])), acc[jj][r][h]);
      }
    }
  }
  sum_lanes_avx2<J, R>(acc, out);
}

// dots<Int4, J, R, 8>: a group per step as above, in two 8-byte halves (elements 0-7 and 16-23
// from bytes 0-7, 8-15 and 24-31 from bytes 8-15).
template <int J, int R>
__attribute__((target("avx2,fma"))) void dots_nibbles_avx2(const float* const* x,
                                                           const Int4* const* w,
                                                           const float* const* sc, int64_t k,
                                                           float* out) {
  constexpr int64_t G = ops::kQuantGroup;
  __m256 acc[J][R][2];
  zero_acc_avx2<J, R>(acc);
  const __m256i low = _mm256_set1_epi32(15), eight = _mm256_set1_epi32(8);
  for (int64_t i = 0; i + G <= k; i += G) {
    __m256 lo[J][2], hi[J][2];
    if (i % 128 == 0)
#pragma GCC unroll 4
      for (int jj = 0; jj < J; ++jj) __builtin_prefetch(nibble_bytes(w[jj], i) + kAhead, 0, 3);
#pragma GCC unroll 4
    for (int jj = 0; jj < J; ++jj) {
      const __m256 s = _mm256_set1_ps(sc[jj][i / G]);
#pragma GCC unroll 2
      for (int q = 0; q < 2; ++q) {
        const __m128i b =
            _mm_loadl_epi64(reinterpret_cast<const __m128i*>(nibble_bytes(w[jj], i) + 8 * q));
        const __m256i c = _mm256_cvtepu8_epi32(b);
        lo[jj][q] =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_and_si256(c, low), eight)), s);
        hi[jj][q] =
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_srli_epi32(c, 4), eight)), s);
      }
    }
    fma_rows_avx2<J, R>(acc, x, i, lo);
    fma_rows_avx2<J, R>(acc, x, i + 16, hi);
  }
  sum_lanes_avx2<J, R>(acc, out);
}

// The intrinsic dots of one kind for every tile shape (J, R) = (I / 4 + 1, I % 4 + 1).
#define MYRIAD_DOTS_TABLE(name, fn)                                                              \
  template <size_t... I>                                                                         \
  constexpr auto name(std::index_sequence<I...>) {                                               \
    return std::array{&fn<static_cast<int>(I / kTile + 1), static_cast<int>(I % kTile + 1)>...}; \
  }
MYRIAD_DOTS_TABLE(codes_table_avx2, dots_codes_avx2)
MYRIAD_DOTS_TABLE(codes_table_avx512, dots_codes_avx512)
MYRIAD_DOTS_TABLE(nibbles_table_avx2, dots_nibbles_avx2)
MYRIAD_DOTS_TABLE(nibbles_table_avx512, dots_nibbles_avx512)
MYRIAD_DOTS_TABLE(q8_table_avx2, dots_q8_avx2)
MYRIAD_DOTS_TABLE(q8_table_avx512, dots_q8_avx512)
MYRIAD_DOTS_TABLE(bf16_pairs_table_avx512, dots_bf16_pairs_avx512)
MYRIAD_DOTS_TABLE(bf16_pairs_table_avx2, dots_bf16_pairs_avx2)
#undef MYRIAD_DOTS_TABLE
#endif

// Whether bf16 rows of B run the pair kernels (dots_bf16_pairs_*), whose rows of A come in their
// pair layout: where the CPU has the instructions of the width wide_vectors() picks.
bool bf16_pairs() {
#if defined(MYRIAD_CODE_INTRINSICS)
  static const bool has512 = __builtin_cpu_supports("avx512f");
  static const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return wide_vectors() ? has512 : has2;
#else
  return false;
#endif
}

// The dots for T at the width wide_vectors() picks; bf16, int8 and int4 take the instructions above
// where the CPU has them (a forced width the CPU lacks runs the generic code).
template <class T>
const auto& dots_for() {
  static constexpr auto wide = dots_table<T, 16>(std::make_index_sequence<kTile * kTile>{});
  static constexpr auto narrow = dots_table<T, 8>(std::make_index_sequence<kTile * kTile>{});
#if defined(MYRIAD_CODE_INTRINSICS)
  if constexpr (std::is_same_v<T, uint16_t>) {
    constexpr auto seq = std::make_index_sequence<kTile * kTile>{};
    static constexpr auto v4 = bf16_pairs_table_avx512(seq);
    static constexpr auto v3 = bf16_pairs_table_avx2(seq);
    if (bf16_pairs()) return wide_vectors() ? v4 : v3;
    return wide_vectors() ? wide : narrow;
  }
  if constexpr (kCodes<T>) {
    constexpr auto seq = std::make_index_sequence<kTile * kTile>{};
    static constexpr auto v4 = [&] {
      if constexpr (std::is_same_v<T, int8_t>)
        return codes_table_avx512(seq);
      else
        return nibbles_table_avx512(seq);
    }();
    static constexpr auto v3 = [&] {
      if constexpr (std::is_same_v<T, int8_t>)
        return codes_table_avx2(seq);
      else
        return nibbles_table_avx2(seq);
    }();
    static const bool has512 = __builtin_cpu_supports("avx512f");
    static const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    if (wide_vectors()) return has512 ? v4 : wide;
    return has2 ? v3 : narrow;
  }
#endif
  return wide_vectors() ? wide : narrow;
}

// The int8-activation dots: AVX512-VNNI at the wide width where the CPU has it, else AVX2 (the
// same bits), else the plain code.
const auto& q8_dots() {
  static constexpr auto generic = q8_table(std::make_index_sequence<kTile * kTile>{});
#if defined(MYRIAD_CODE_INTRINSICS)
  static constexpr auto v4 = q8_table_avx512(std::make_index_sequence<kTile * kTile>{});
  static constexpr auto v3 = q8_table_avx2(std::make_index_sequence<kTile * kTile>{});
  static const bool has2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (wide_vectors() && has_vnni()) return v4;
  if (has2) return v3;
#endif
  return generic;
}

// C[r, j] for j in [j0, j1) from x (m rows of k f32), in tiles of up to 4 x 4: four rows of B
// share each load of x, and at m = 1 their four sums are four independent chains of fused
// multiply-adds. One row of B at a time (one chain) bounded a single row of A by the adds'
// latency wherever B came from a cache: on the Xeon with a 480 MiB L3 that holds a small model's
// weights, four rows raised the f32 weight stream from 97 to 148 GB/s (2 MiB of B) and from 28 to
// 38 GB/s (128 MiB), and K3-form batch-1 decode from 124-128 to 152-156 tokens/s. (On the first
// machine, streaming from DRAM, four rows had halved a core's rate, 19.5 vs 10 GB/s.)
// bs: int8 B's scales, lds apart per row. x.at(r): row r of A as the table's kernels take it (f32
// rows, or QRow for int8 activations).
struct F32Rows {
  const float* x;
  int64_t ldx;
  const float* at(int64_t r) const { return x + r * ldx; }
};
template <class T, class C, class Rows, class Table>
void rows_of_bt(const Table& table, const Rows& x, const T* b, int64_t ldb, const float* bs,
                int64_t lds, C* c, int64_t ldc, int64_t m, int64_t k, int64_t j0, int64_t j1,
                float alpha, float beta) {
  using Row = decltype(x.at(0));
  for (int64_t j = j0; j < j1; j += kTile) {
    const int64_t nj = std::min<int64_t>(kTile, j1 - j);
    const T* ws[kTile] = {};
    const float* ss[kTile] = {};
    for (int64_t jj = 0; jj < nj; ++jj) ws[jj] = b + (j + jj) * ldb;
    if (bs)
      for (int64_t jj = 0; jj < nj; ++jj) ss[jj] = bs + (j + jj) * lds;
    for (int64_t r = 0; r < m; r += kTile) {
      const int64_t nr = std::min<int64_t>(kTile, m - r);
      Row xs[kTile] = {};
      for (int64_t q = 0; q < nr; ++q) xs[q] = x.at(r + q);
      float s[kTile * kTile] = {};
      table[(nj - 1) * kTile + nr - 1](xs, ws, ss, k, s);
      for (int64_t jj = 0; jj < nj; ++jj)
        for (int64_t q = 0; q < nr; ++q)
          store(c + (r + q) * ldc + j + jj, alpha * s[jj * kTile + q], beta);
    }
  }
}

// Over every product and batch: work items are (product, batch, block of n), at least ~64 KiB
// of B each, so a thread is woken only for work that outweighs waking it, and all of them share
// one parallel region (a MoE's experts at decode: one region instead of one per expert). bf16
// rows of A are widened to f32 once, before the region, and int8 activations (a_bits 8) are
// quantized once per distinct A (linear_quant_cat's products share theirs). T: B's elements
// (float, bf16 bits, int8 codes, int4 byte pairs); C has A's type (f32 for quantized B).
template <class T>
void few_rows(const std::vector<GemmArgs>& gs) {
  using C = std::conditional_t<kCodes<T>, float, T>;
  constexpr int64_t per_unit = std::is_same_v<T, Int4> ? 2 : 1;  // elements per T of B
  constexpr bool widen = std::is_same_v<T, uint16_t>;
  struct Job {
    const float* x;
    int64_t ldx, stride_x, block, per_batch;
  };
  std::vector<Job> jobs(gs.size());
  std::vector<int64_t> first(gs.size() + 1, 0);  // first work item of each product
  std::vector<float> widened;
  std::vector<int64_t> widened_at(gs.size(), 0);
  // bf16 rows of A widened to f32 (k a row), or for the pair kernels in their layout (k rounded
  // up to 32).
  const bool pairs = widen && bf16_pairs();
  const auto widened_k = [&](int64_t k) { return pairs ? (k + 31) / 32 * 32 : k; };
  std::vector<QRows> quantized;
  std::vector<size_t> quantized_at(gs.size(), 0);
  for (size_t p = 0; p < gs.size(); ++p) {
    const GemmArgs& g = gs[p];
    Job& j = jobs[p];
    if (g.a_bits == 8) {
      size_t same = p;
      for (size_t o = 0; o < p && same == p; ++o)
        if (gs[o].a_bits == 8 && gs[o].a == g.a && gs[o].lda == g.lda && gs[o].m == g.m &&
            gs[o].k == g.k)
          same = o;
      quantized_at[p] = same < p ? quantized_at[same] : quantized.size();
      if (same == p)
        quantized.push_back(quantize_rows(static_cast<const float*>(g.a), g.lda, g.m, g.k));
    }
    j.block = std::max<int64_t>(
        4, (int64_t{64} << 10) / std::max<int64_t>(1, g.k / per_unit * int64_t{sizeof(T)}));
    j.per_batch = (g.n + j.block - 1) / j.block;
    first[p + 1] = first[p] + g.batch * j.per_batch;
    if constexpr (!widen) {
      j.x = static_cast<const float*>(g.a), j.ldx = g.lda, j.stride_x = g.stride_a;
    } else {
      widened_at[p] = static_cast<int64_t>(widened.size());
      const int64_t batches = g.stride_a == 0 ? 1 : g.batch;
      widened.resize(widened.size() + static_cast<size_t>(batches * g.m * widened_k(g.k)));
    }
  }
  if constexpr (widen) {
    for (size_t p = 0; p < gs.size(); ++p) {
      const GemmArgs& g = gs[p];
      const int64_t batches = g.stride_a == 0 ? 1 : g.batch;
      float* w = widened.data() + widened_at[p];
      const int64_t kw = widened_k(g.k);
      for (int64_t bi = 0; bi < batches; ++bi)
        for (int64_t r = 0; r < g.m; ++r) {
          const T* src = static_cast<const T*>(g.a) + bi * g.stride_a + r * g.lda;
          float* dst = w + (bi * g.m + r) * kw;
          if (!pairs) {
            for (int64_t i = 0; i < g.k; ++i) dst[i] = bf16_load(src[i]);
            continue;
          }
          const auto at = [&](int64_t e) { return e < g.k ? bf16_load(src[e]) : 0.0f; };
          for (int64_t b = 0; b < kw; b += 32)  // a block's odd elements, then its even ones
            for (int64_t l = 0; l < 16; ++l) {
              dst[b + l] = at(b + 2 * l + 1);
              dst[b + 16 + l] = at(b + 2 * l);
            }
        }
      jobs[p].x = w, jobs[p].ldx = kw, jobs[p].stride_x = g.stride_a == 0 ? 0 : g.m * kw;
    }
  }
  parallel_for(first.back(), 1, [&](int64_t w0, int64_t w1) {
    size_t p =
        static_cast<size_t>(std::upper_bound(first.begin(), first.end(), w0) - first.begin()) - 1;
    for (int64_t w = w0; w < w1; ++w) {
      while (w >= first[p + 1]) ++p;
      const GemmArgs& g = gs[p];
      const Job& j = jobs[p];
      const int64_t item = w - first[p];
      const int64_t bi = item / j.per_batch, c0 = (item % j.per_batch) * j.block;
      const int64_t c1 = std::min(g.n, c0 + j.block);
      const T* b = static_cast<const T*>(g.b) + bi * g.stride_b;
      C* c = static_cast<C*>(g.c) + bi * g.stride_c;
      const float* bs =
          g.b_scale ? g.b_scale + bi * g.stride_b * per_unit / ops::kQuantGroup : nullptr;
      const int64_t lds = g.ldb * per_unit / ops::kQuantGroup;
      if constexpr (std::is_same_v<T, int8_t>) {
        if (g.a_bits == 8) {  // (batch 1)
          rows_of_bt(q8_dots(), quantized[quantized_at[p]], b, g.ldb, bs, lds, c, g.ldc, g.m, g.k,
                     c0, c1, g.alpha, g.beta);
          continue;
        }
      }
      rows_of_bt(dots_for<T>(), F32Rows{j.x + bi * j.stride_x, j.ldx}, b, g.ldb, bs, lds, c, g.ldc,
                 g.m, g.k, c0, c1, g.alpha, g.beta);
    }
  });
}

bool takes_few_rows(const GemmArgs& g) {
  return g.m <= (g.dtype == DType::BF16 ? 4 : kMaxRows) && g.trans_b && !g.trans_a && g.k > 0;
}

// The calling thread's scratchpad, grown to the largest a primitive asks for (page-aligned).
void* thread_scratch(size_t bytes) {
  struct Buffer {
    void* p = nullptr;
    size_t size = 0;
    ~Buffer() { std::free(p); }
  };
  thread_local Buffer buf;
  if (bytes > buf.size) {
    std::free(buf.p);
    buf.size = (bytes + 4095) / 4096 * 4096;
    buf.p = std::aligned_alloc(4096, buf.size);
    MYRIAD_CHECK(buf.p, "matmul: cannot allocate a ", buf.size, "-byte oneDNN scratchpad");
  }
  return buf.p;
}

// Elements from an operand's first to one past its last (rows x cols stored with leading
// dimension ld, batch of them stride apart).
size_t span(int64_t batch, int64_t rows, int64_t cols, bool trans, int64_t ld, int64_t stride) {
  const int64_t r = trans ? cols : rows, c = trans ? rows : cols;
  return static_cast<size_t>((batch - 1) * stride + (r - 1) * ld + c);
}

void onednn(const GemmArgs& g, bool any_size = false);

// CPUs without a bf16 matmul in oneDNN (AVX2 without AVX-512 BF16 or AVX-NE-CONVERT): the bf16
// operands are widened to f32 (exactly), multiplied in f32 with the same layout and rounded back;
// the gaps between rows make the round trip unchanged.
void onednn_bf16_via_f32(const GemmArgs& g, bool any_size) {
  const auto widen = [](const void* src, size_t n) {
    std::vector<float> out(n);
    const auto* h = static_cast<const uint16_t*>(src);
    for (size_t i = 0; i < n; ++i) out[i] = bf16_load(h[i]);
    return out;
  };
  const size_t na = span(g.batch, g.m, g.k, g.trans_a, g.lda, g.stride_a);
  const size_t nb = span(g.batch, g.k, g.n, g.trans_b, g.ldb, g.stride_b);
  const size_t nc = span(g.batch, g.m, g.n, false, g.ldc, g.stride_c);
  std::vector<float> a = widen(g.a, na), b = widen(g.b, nb), c = widen(g.c, nc);
  GemmArgs f = g;
  f.dtype = DType::F32, f.a = a.data(), f.b = b.data(), f.c = c.data();
  onednn(f, any_size);
  auto* h = static_cast<uint16_t*>(g.c);
  for (size_t i = 0; i < nc; ++i) h[i] = bf16_store(c[i]);
}

void onednn(const GemmArgs& g, bool any_size) {
  static std::atomic<bool> no_bf16{false};
  if (g.dtype == DType::BF16 && no_bf16.load()) return onednn_bf16_via_f32(g, any_size);
  Bound* bp = nullptr;
  try {
    bp = &bound_for(g, any_size);
  } catch (const dnnl::error&) {
    if (g.dtype != DType::BF16) throw;
    no_bf16.store(true);
    return onednn_bf16_via_f32(g, any_size);
  }
  Bound& b = *bp;
  const size_t scratch = b.e->scratch.get_size();
  b.args[DNNL_ARG_SCRATCHPAD].set_data_handle(scratch ? thread_scratch(scratch) : nullptr);
  if (any_size) {  // this call's sizes: memory objects with the concrete descriptors
    const auto [a, bm, c] = operand_mds(g, false);
    b.args[DNNL_ARG_SRC] = dnnl::memory(a, engine(), const_cast<void*>(g.a));
    b.args[DNNL_ARG_WEIGHTS] = dnnl::memory(bm, engine(), const_cast<void*>(g.b));
    b.args[DNNL_ARG_DST] = dnnl::memory(c, engine(), g.c);
  } else {
    b.args[DNNL_ARG_SRC].set_data_handle(const_cast<void*>(g.a));
    b.args[DNNL_ARG_WEIGHTS].set_data_handle(const_cast<void*>(g.b));
    b.args[DNNL_ARG_DST].set_data_handle(g.c);
  }
  b.e->prim.execute(stream(), b.args);
}

void check_dtype(const GemmArgs& g) {
  MYRIAD_CHECK(g.dtype == DType::F32 || g.dtype == DType::BF16,
               "matmul: the cpu kernel supports f32 and bf16, not ", dtype_name(g.dtype));
}

void few_rows_any(const std::vector<GemmArgs>& gs) {
  if (gs.empty()) return;
  if (gs[0].dtype == DType::F32) return few_rows<float>(gs);
  few_rows<uint16_t>(gs);
}

void gemm_cpu(const GemmArgs& g) {
  check_dtype(g);
  if (g.k == 0) return scale_c(g);
  if (takes_few_rows(g)) return few_rows_any({g});
  onednn(g);
}

// A larger product of a group: oneDNN through a primitive of any m and k (key_of).
void grouped_one(const GemmArgs& g) {
  if (g.k == 0) return scale_c(g);
  onednn(g, true);
}

// The few-row products share one parallel region. The larger ones (a MoE's experts in prefill
// and training) are dealt to the threads, largest first to the least loaded, each thread running
// its whole products one after another: oneDNN inside a parallel region runs its threads' shares
// in turn on the calling thread, so every product gets the bits it gets alone in a group of one
// however the group is dealt, and a layer's experts cost one region instead of one per expert.
// (Not gemm_cpu's bits: that creates a primitive for each shape, where these take any size.)
void grouped_gemm_cpu(const std::vector<GemmArgs>& gs) {
  std::vector<GemmArgs> few, large;
  for (const GemmArgs& g : gs) {
    check_dtype(g);
    (takes_few_rows(g) ? few : large).push_back(g);
  }
  few_rows_any(few);
  const int threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  if (threads <= 1 || large.size() < 2 * static_cast<size_t>(threads)) {
    for (const GemmArgs& g : large) grouped_one(g);
    return;
  }
  std::vector<double> work(large.size());
  std::vector<size_t> order(large.size());
  for (size_t i = 0; i < large.size(); ++i) {
    order[i] = i;
    work[i] = static_cast<double>(large[i].m) * large[i].n * std::max<int64_t>(large[i].k, 1);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return work[a] > work[b]; });
  std::vector<std::vector<size_t>> mine(static_cast<size_t>(threads));
  std::vector<double> load(static_cast<size_t>(threads), 0.0);
  for (size_t i : order) {
    const size_t t = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    mine[t].push_back(i);
    load[t] += work[i];
  }
  std::exception_ptr error;  // an exception must not leave the parallel region
#pragma omp parallel num_threads(threads)
  try {
    for (size_t i : mine[static_cast<size_t>(omp_get_thread_num())]) grouped_one(large[i]);
  } catch (...) {
#pragma omp critical(myriad_grouped_gemm_error)
    if (!error) error = std::current_exception();
  }
  if (error) std::rethrow_exception(error);
}

// Quantized B (ops/quant.h): the few-row kernel only, all products in one parallel region.
void quant_gemm_cpu(const std::vector<GemmArgs>& gs) {
  if (gs.empty()) return;
  const int bits = gs[0].b_bits;
  for (const GemmArgs& g : gs)
    MYRIAD_CHECK(
        g.dtype == DType::F32 && g.b_scale && takes_few_rows(g) && g.k % ops::kQuantGroup == 0 &&
            (bits == 8 || bits == 4) && g.b_bits == bits && g.ldb == g.k * bits / 8 &&
            (g.a_bits == 0 || (g.a_bits == 8 && bits == 8 && g.batch == 1)),
        "quant_gemm: expected f32 A and C, B [n, k] of ", bits,
        "-bit codes (one format) with scales and k a multiple of ", ops::kQuantGroup, ", at most ",
        kMaxRows, " rows, A as f32 or (8-bit B, batch 1) int8; got m ", g.m, " k ", g.k, " ldb ",
        g.ldb, " bits ", g.b_bits, " activation bits ", g.a_bits, " batch ", g.batch);
  if (bits == 8)
    few_rows<int8_t>(gs);
  else
    few_rows<Int4>(gs);
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::gemm_kernels, ops::Backend::CPU, &gemm_cpu);
MYRIAD_REGISTER_KERNEL(ops::quant_gemm_kernels, ops::Backend::CPU, &quant_gemm_cpu);
MYRIAD_REGISTER_KERNEL(ops::grouped_gemm_kernels, ops::Backend::CPU, &grouped_gemm_cpu);

}  // namespace myriad::cpu
