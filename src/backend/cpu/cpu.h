// Shared helpers of the CPU kernels: OpenMP parallel loops, runtime-dispatched vector clones,
// bf16 conversion, and a vectorisable exp.
#pragma once
#include <omp.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "core/dtype.h"

// Compiles the function for AVX-512 (x86-64-v4), AVX2 (v3) and the baseline; the loader picks
// the best one for the running CPU. Not under the sanitizers: the clones' resolvers run before
// the sanitizer runtime is set up.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
#define MYRIAD_CPU_CLONES \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define MYRIAD_CPU_CLONES
#endif

namespace myriad::cpu {

// Whether idle OpenMP threads sleep between parallel regions (OMP_WAIT_POLICY=passive, which
// scripts/main.sh and scripts/test.sh set for shared machines): waking one then costs tens of
// microseconds instead of one, so a region must carry kSleepGrain times the work to pay. Measured
// on batch-1 decode (68M K3 form, 2 threads): passive waiting took it from 154 to 72 tokens/s,
// below the single-thread 139, while every decode op's region was woken for a few microseconds
// of work.
bool threads_sleep();
// Gives back the calling thread's idle OpenMP workers (omp_pause_resource_all; no-op inside a
// parallel region or where the thread has none). libgomp counts the workers of every thread that
// has run a parallel region, and once they outnumber the CPUs it stops spinning between regions
// in every team: workers sleep after ~100 spins, and each region then pays their wake-up. A
// thread that hands its work to another (a model loaded here, decoded on the engine's thread)
// calls this: on the 2-core VM, a bf16 load's conversions on the main thread had left one worker
// there, and batch-1 decode on the engine's thread ran at half speed (50 us per region).
void release_idle_workers();
inline constexpr int64_t kSleepGrain = 16;

// While one lives, the calling thread flushes subnormal floats to zero, as inputs and results
// (x86 MXCSR FTZ + DAZ; restored after; MYRIAD_DENORMALS=keep disables it). KDA's kernels hold one
// in each thread: on Intel CPUs an operation on a subnormal takes a microcode assist of ~100
// cycles, and KDA's decayed states and gates reach them (bench_kda forward + backward ran at 4.6
// instead of 68 GFLOP/s on a Xeon; AMD CPUs take no such penalty). Values below 1.2e-38 change
// nothing a model computes; not process-wide, since serving prints and parses such numbers.
class FlushSubnormals {
 public:
  FlushSubnormals();
  ~FlushSubnormals();
  FlushSubnormals(const FlushSubnormals&) = delete;
  FlushSubnormals& operator=(const FlushSubnormals&) = delete;

 private:
  unsigned saved_ = 0;
  bool set_ = false;
};

// Runs f(begin, end) over [0, n) in parallel chunks of at least `grain` items, whatever the
// wait policy: for items that each carry enough work to pay a sleeping thread's wake-up.
template <class F>
void parallel_split(int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  int64_t max_threads = omp_in_parallel() ? 1 : omp_get_max_threads();
  int64_t chunks = std::min<int64_t>(max_threads, (n + grain - 1) / std::max<int64_t>(grain, 1));
  if (chunks <= 1) {
    f(int64_t{0}, n);
    return;
  }
#pragma omp parallel for num_threads(chunks) schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    int64_t b = n * c / chunks, e = n * (c + 1) / chunks;
    f(b, e);
  }
}

// Runs f(begin, end) over [0, n) in parallel chunks of at least `grain` items (kSleepGrain times
// that when threads_sleep()).
template <class F>
void parallel_for(int64_t n, int64_t grain, F&& f) {
  parallel_split(n, threads_sleep() ? grain * kSleepGrain : grain, std::forward<F>(f));
}

// GCC vector types of W f32 lanes (F), with the uint32 (U) and bf16 (H) vectors of the same
// lane count; naturally aligned, so kernels load and store them with memcpy (which compiles to
// one unaligned move; an under-aligned typedef made GCC copy through the stack). The kernels
// are templates on W and run with W = 16 (one zmm) where the CPU has AVX-512 and W = 8 (one ymm)
// elsewhere: a 64-byte vector on an AVX2 CPU is lowered through the stack, which measured 10x
// slower than 32-byte ones (a 4 x 64 tile product: 2.4 vs 27 GFLOP/s on a Zen 3 core).
template <int W>
struct Lanes;
template <>
struct Lanes<16> {
  typedef float F __attribute__((vector_size(64)));
  typedef uint32_t U __attribute__((vector_size(64)));
  typedef uint16_t H __attribute__((vector_size(32)));
};
template <>
struct Lanes<8> {
  typedef float F __attribute__((vector_size(32)));
  typedef uint32_t U __attribute__((vector_size(32)));
  typedef uint16_t H __attribute__((vector_size(16)));
};
bool wide_vectors();      // whether to run W = 16: AVX-512F present (read once)
void force_lanes(int w);  // tests: run W = w (8 or 16) whatever the CPU; 0 restores the default

// f(std::integral_constant<int, W>{}) with the W wide_vectors() picks.
template <class F>
decltype(auto) with_lanes(F&& f) {
  if (wide_vectors()) return f(std::integral_constant<int, 16>{});
  return f(std::integral_constant<int, 8>{});
}

inline float bf16_load(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}
inline uint16_t bf16_store(float f) {  // round to nearest even (NaN inputs are not expected)
  uint32_t u = std::bit_cast<uint32_t>(f);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// exp(x) in f32 to ~2 ulp, branch-free so loops over it vectorise: exp(x) = 2^n * exp(r) with
// r = x - n ln2 (Cody-Waite) and a degree-6 polynomial for exp(r).
inline float fast_exp(float x) {
  x = x < -87.3f ? -87.3f : (x > 88.7f ? 88.7f : x);
  // Round to nearest by adding and removing 1.5 * 2^23 (a library round() would not vectorise).
  float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;
  float r = x - n * 0.693145751953125f;
  r = r - n * 1.42860682030941723e-6f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  int32_t e = (static_cast<int32_t>(n) + 127) << 23;
  return p * std::bit_cast<float>(e);
}

// log(1 + e^x) in f32 to a few ulp, branch-free so loops over it vectorise (libm's log1pf does
// not): max(x, 0) + log1p(u) with u = e^-|x| in (0, 1], and log1p(u) = 2 atanh(s) for
// s = u / (2 + u) <= 1/3, an odd series to s^15 (the next term is below 2e-9 of the sum). For
// |x| > 87 u would be subnormal: the term is taken as 0 there (e^-87 is below f32's resolution
// for x > 0; for x < -87 the result flushes to 0, as with FTZ).
inline float fast_softplus(float x) {
  const float a = x < 0.0f ? -x : x;
  const float u = a > 87.0f ? 0.0f : fast_exp(-a);
  const float s = u / (2.0f + u), s2 = s * s;
  float p = 1.0f / 15.0f;
  p = p * s2 + 1.0f / 13.0f;
  p = p * s2 + 1.0f / 11.0f;
  p = p * s2 + 1.0f / 9.0f;
  p = p * s2 + 1.0f / 7.0f;
  p = p * s2 + 1.0f / 5.0f;
  p = p * s2 + 1.0f / 3.0f;
  p = p * s2 + 1.0f;
  return (x > 0.0f ? x : 0.0f) + 2.0f * s * p;
}

}  // namespace myriad::cpu
