// Helpers shared by the benchmark executables: a reporter that keeps every run's counters for
// the summary table each binary prints after Google Benchmark's own output, command-line /
// environment settings, and the nominal CPU clock.
#pragma once
#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>
#include <unistd.h>

#include <chrono>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "backend/cpu/amx.h"

namespace myriad::bench {

// Console output as usual, plus each run's counters (already turned into rates) by the name the
// benchmark was registered under.
class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    for (const Run& r : runs)
      if (!r.error_occurred && r.run_type == Run::RT_Iteration)
        for (const auto& [key, c] : r.counters)
          values_[r.run_name.function_name][key].push_back(c.value);
    ConsoleReporter::ReportRuns(runs);
  }
  // The largest value of counter `key` over the runs named in `names`; 0 when none ran.
  double best(const std::vector<std::string>& names, const std::string& key) const {
    double v = 0;
    for (const std::string& n : names) {
      auto it = values_.find(n);
      if (it == values_.end()) continue;
      auto jt = it->second.find(key);
      if (jt == it->second.end()) continue;
      for (double x : jt->second) v = std::max(v, x);
    }
    return v;
  }

 private:
  std::map<std::string, std::map<std::string, std::vector<double>>> values_;
};

// Removes "--name=value" from argv (Google Benchmark rejects flags it does not know) and returns
// its value; else the environment variable `env`; else `fallback`.
inline double take_flag(int& argc, char** argv, const char* name, const char* env,
                        double fallback) {
  const std::string prefix = std::string("--") + name + "=";
  double v = fallback;
  if (const char* e = std::getenv(env)) v = std::atof(e);
  int w = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      v = std::atof(argv[i] + prefix.size());
    else
      argv[w++] = argv[i];
  }
  argc = w;
  return v;
}

// The same for a string flag "--name=value" (else `env`, else `fallback`).
inline std::string take_string(int& argc, char** argv, const char* name, const char* env,
                               const std::string& fallback) {
  const std::string prefix = std::string("--") + name + "=";
  std::string v = fallback;
  if (const char* e = std::getenv(env)) v = e;
  int w = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strncmp(argv[i], prefix.c_str(), prefix.size()) == 0)
      v = argv[i] + prefix.size();
    else
      argv[w++] = argv[i];
  }
  argc = w;
  return v;
}

// The first "cpu MHz" of /proc/cpuinfo (the nominal clock as the kernel reports it), 0 if none.
inline double cpu_mhz() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("cpu MHz", 0) == 0) {
      auto colon = line.find(':');
      if (colon != std::string::npos) return std::atof(line.c_str() + colon + 1);
    }
  return 0;
}

// The machine's arithmetic peak, measured: every OpenMP thread runs independent chains of
// AVX-512 FMAs (f32: vfmadd231ps, 32 FLOP each) or bf16 dot products (vdpbf16ps, 64 FLOP each),
// 16 accumulators deep to cover the latency, for 10-20 ms, best of 3. On CPUs with AMX-BF16 the
// bf16 peak is instead that of the tile unit (amx_chain_flops below), which oneDNN's bf16 matmul
// uses and which runs several times faster than VDPBF16PS. Nothing a GEMM does can go faster, so
// "fraction of peak" against this figure is honest whatever the clock. 0 without AVX-512 (bf16:
// without AVX-512 BF16 or AMX-BF16) and without AVX2 + FMA. peak_method names what was measured.
__attribute__((target("avx512f,avx512bf16"))) inline double fma_chain_flops(bool bf16,
                                                                            int64_t iters) {
  __m512 acc[16];
  for (int i = 0; i < 16; ++i) acc[i] = _mm512_set1_ps(0.001f * i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  const __m512bh ab = (__m512bh)_mm512_set1_epi16(0x3f80), bb = (__m512bh)_mm512_set1_epi16(0x3380);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 16; ++i)
      acc[i] = bf16 ? _mm512_dpbf16_ps(acc[i], ab, bb) : _mm512_fmadd_ps(acc[i], a, b);
  alignas(64) float lanes[16];
  float sink = 0;
  for (int i = 0; i < 16; ++i) {  // (_mm512_reduce_add_ps trips a GCC 12 -Wuninitialized bug)
    _mm512_store_ps(lanes, acc[i]);
    for (float v : lanes) sink += v;
  }
  benchmark::DoNotOptimize(sink);
  return static_cast<double>(iters) * 16 * (bf16 ? 64 : 32);
}
// The same on AVX2 + FMA CPUs (f32 only: vfmadd231ps on ymm, 16 FLOP each), 12 chains deep (two
// FMA pipes of 4 cycles' latency need 8; 16 registers hold 12 plus the two operands).
__attribute__((target("avx2,fma"))) inline double fma_chain_flops_avx2(int64_t iters) {
  __m256 acc[12];
  for (int i = 0; i < 12; ++i) acc[i] = _mm256_set1_ps(0.001f * i);
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it)
    for (int i = 0; i < 12; ++i) acc[i] = _mm256_fmadd_ps(acc[i], a, b);
  alignas(32) float lanes[8];
  float sink = 0;
  for (int i = 0; i < 12; ++i) {
    _mm256_store_ps(lanes, acc[i]);
    for (float v : lanes) sink += v;
  }
  benchmark::DoNotOptimize(sink);
  return static_cast<double>(iters) * 12 * 16;
}

// The bf16 chains on the AMX tile unit: tiles 0-3 accumulate C[i][j] += A[i] B[j] from A in
// tiles 4-5 and B in tiles 6-7, all 16 rows x 64 bytes (palette 1), so four independent
// TDPBF16PS chains (a full 16x16x32 product: 16 * 16 * 32 * 2 = 16384 FLOP each) cover the
// instruction's latency at one issue per 16 cycles. The tiles are configured on the calling
// thread and released at the end (oneDNN configures its own before every kernel).
__attribute__((target("amx-tile,amx-bf16"))) inline double amx_chain_flops(int64_t iters) {
  struct alignas(64) TileConfig {
    uint8_t palette_id = 1, start_row = 0, reserved[14] = {};
    uint16_t colsb[16] = {};
    uint8_t rows[16] = {};
  } cfg;
  for (int t = 0; t < 8; ++t) cfg.colsb[t] = 64, cfg.rows[t] = 16;
  alignas(64) uint16_t a[16 * 32], b[16 * 32];
  std::fill(a, a + 16 * 32, uint16_t{0x3f80});  // 1.0
  std::fill(b, b + 16 * 32, uint16_t{0x3380});  // 2^-24: the sums stay finite and normal
  alignas(64) float c[16 * 16];
  // GCC 12's ldtilecfg and tileloadd asm tell the compiler of 8 bytes of the config and none of
  // the tile data: a barrier makes every store above happen first.
  asm volatile("" : : "r"(&cfg), "r"(a), "r"(b) : "memory");
  _tile_loadconfig(&cfg);
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a, 64);
  _tile_loadd(6, b, 64);
  _tile_loadd(7, b, 64);
  for (int64_t it = 0; it < iters; ++it) {
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
  }
  float sink = 0;
  _tile_stored(0, c, 64);
  for (float v : c) sink += v;
  _tile_stored(3, c, 64);
  for (float v : c) sink += v;
  _tile_release();
  benchmark::DoNotOptimize(sink);
  return static_cast<double>(iters) * 4 * (16 * 16 * 32 * 2);
}

// What measured_peak_gflops(bf16) measures on this CPU, for the benchmarks' labels.
inline const char* peak_method(bool bf16) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (bf16) {
    if (cpu::amx_bf16_hardware()) return "AMX TDPBF16PS";
    return avx512 && __builtin_cpu_supports("avx512bf16") ? "AVX-512 VDPBF16PS" : "none";
  }
  if (avx512) return "AVX-512 FMA";
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? "AVX2 FMA" : "none";
}

inline double measured_peak_gflops(bool bf16) {
  const bool amx = bf16 && cpu::amx_bf16_hardware();
  const bool avx512 = __builtin_cpu_supports("avx512f");
  if (!amx) {
    if (!avx512 && !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return 0;
    if (bf16 && !__builtin_cpu_supports("avx512bf16")) return 0;
  }
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const int64_t iters = 4'000'000, amx_iters = 1'000'000;
    double flops = 0;
    auto t0 = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : flops)
    flops += amx      ? amx_chain_flops(amx_iters)
             : avx512 ? fma_chain_flops(bf16, iters)
                      : fma_chain_flops_avx2(iters);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::max(best, flops / s * 1e-9);
  }
  return best;
}

}  // namespace myriad::bench
