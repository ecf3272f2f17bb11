// How the OpenMP runtime waits (and giving back idle workers), how wide the CPU's vectors are, read
// once, and the scoped flushing of subnormal floats (see cpu.h).
#include <atomic>
#include <cctype>
#include <cstdlib>
#include <string>
#if defined(__x86_64__)
#include <xmmintrin.h>
#endif

#include "backend/cpu/cpu.h"

namespace myriad::cpu {

bool threads_sleep() {
  static const bool sleep = [] {
    const char* v = std::getenv("OMP_WAIT_POLICY");
    std::string s = v ? v : "";
    for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return s == "passive";
  }();
  return sleep;
}

void release_idle_workers() {
  if (!omp_in_parallel()) omp_pause_resource_all(omp_pause_soft);
}

namespace {
std::atomic<int> forced_lanes{0};
}
bool wide_vectors() {
  static const bool avx512 = [] {
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__) && !defined(__SANITIZE_THREAD__)
    return __builtin_cpu_supports("avx512f") != 0;
#else
    return false;  // no target clones here: the baseline code has no 64-byte registers either
#endif
  }();
  const int forced = forced_lanes.load(std::memory_order_relaxed);
  return forced ? forced == 16 : avx512;
}
void force_lanes(int w) {
  forced_lanes.store(w, std::memory_order_relaxed);
}

namespace {
constexpr unsigned kFtzDaz = 0x8040u;  // MXCSR bits 15 (flush to zero) and 6 (denormals are zero)
bool flush_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("MYRIAD_DENORMALS");
    return !(v && std::string(v) == "keep");
  }();
  return on;
}
}  // namespace

FlushSubnormals::FlushSubnormals() {
#if defined(__x86_64__)
  if (!flush_enabled()) return;
  saved_ = _mm_getcsr();
  set_ = true;
  if ((saved_ & kFtzDaz) != kFtzDaz) _mm_setcsr(saved_ | kFtzDaz);
#endif
}
FlushSubnormals::~FlushSubnormals() {
#if defined(__x86_64__)
  if (set_ && (saved_ & kFtzDaz) != kFtzDaz) _mm_setcsr(saved_);
#endif
}

}  // namespace myriad::cpu
