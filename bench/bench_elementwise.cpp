// Element-wise bandwidth: ops::add (two inputs, one output) and ops::mul by a scalar on 16M
// contiguous f32 elements, next to std::memcpy of the same bytes and to plain C++ loops doing
// the same arithmetic. GB/s (1e9 bytes) count the bytes each one must move (add: 3 x 64 MiB,
// scale and memcpy: 2 x 64 MiB); the summary gives each as a ratio to memcpy's GB/s.
//
//   OMP_NUM_THREADS=2 bench_elementwise [--rounds=3] [--min_time=0.3]
// (environment: MYRIAD_BENCH_ROUNDS, MYRIAD_BENCH_MIN_TIME), plus Google Benchmark's flags.
#include <omp.h>

#include <cstdio>
#include <cstring>
#include <functional>

#include "bench_util.h"
#include "core/autograd.h"
#include "core/random.h"
#include "ops/elementwise.h"

namespace myriad::bench {
namespace {

constexpr int64_t kN = int64_t{1} << 24;  // 16M f32 = 64 MiB per tensor

struct Buffers {
  Tensor a, b, out;
};
Buffers& buffers() {
  static Buffers s = [] {
    Generator g(7);
    return Buffers{g.normal({kN}, 0, 1), g.normal({kN}, 0, 1), Tensor::zeros({kN})};
  }();
  return s;
}

// Runs body once untimed (first touch, caches warm), then times it.
void run(benchmark::State& st, double bytes, const std::function<void()>& body) {
  body();
  for (auto _ : st) {
    body();
    benchmark::ClobberMemory();
  }
  st.counters["BYTES"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}

// The same threads split the work as Myriad's kernels do: contiguous chunks, one per thread.
template <class F>
void omp_chunks(F&& f) {
#pragma omp parallel
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    f(kN * t / nt, kN * (t + 1) / nt);
  }
}

struct Impl {
  const char* name;
  double bytes;
  std::function<void()> body;
};

std::vector<Impl> impls() {
  const double mb64 = 4.0 * kN;
  Buffers& s = buffers();
  return {
      {"ops::add", 3 * mb64, [&s] { benchmark::DoNotOptimize(ops::add(s.a, s.b).data_ptr()); }},
      {"loop add (omp)", 3 * mb64,
       [&s] {
         const float *a = s.a.data<float>(), *b = s.b.data<float>();
         float* o = s.out.data<float>();
         omp_chunks([&](int64_t lo, int64_t hi) {
           for (int64_t i = lo; i < hi; ++i) o[i] = a[i] + b[i];
         });
       }},
      {"ops::mul scalar", 2 * mb64,
       [&s] { benchmark::DoNotOptimize(ops::mul(s.a, 1.5).data_ptr()); }},
      {"loop scale (omp)", 2 * mb64,
       [&s] {
         const float* a = s.a.data<float>();
         float* o = s.out.data<float>();
         omp_chunks([&](int64_t lo, int64_t hi) {
           for (int64_t i = lo; i < hi; ++i) o[i] = a[i] * 1.5f;
         });
       }},
      {"memcpy (1 thread)", 2 * mb64,
       [&s] { std::memcpy(s.out.data_ptr(), s.a.data_ptr(), 4 * kN); }},
      {"memcpy (omp)", 2 * mb64,
       [&s] {
         const float* a = s.a.data<float>();
         float* o = s.out.data<float>();
         omp_chunks([&](int64_t lo, int64_t hi) { std::memcpy(o + lo, a + lo, 4 * (hi - lo)); });
       }},
  };
}

}  // namespace
}  // namespace myriad::bench

int main(int argc, char** argv) {
  using namespace myriad;
  using namespace myriad::bench;
  const int rounds = static_cast<int>(take_flag(argc, argv, "rounds", "MYRIAD_BENCH_ROUNDS", 3));
  const double min_time = take_flag(argc, argv, "min_time", "MYRIAD_BENCH_MIN_TIME", 0.3);
  NoGradGuard no_grad;
  std::vector<Impl> all = impls();
  std::vector<std::vector<std::string>> names(all.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t j = 0; j < all.size(); ++j) {
      // Odd rounds run in reverse order so drift in the machine's load evens out.
      const size_t i = r % 2 ? all.size() - 1 - j : j;
      std::string name = std::string(all[i].name) + "/f32/16M/round:" + std::to_string(r);
      names[i].push_back(name);
      benchmark::RegisterBenchmark(
          name.c_str(), [&all, i](benchmark::State& st) { run(st, all[i].bytes, all[i].body); })
          ->UseRealTime()
          ->MinTime(min_time)
          ->Unit(benchmark::kMillisecond);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);

  double memcpy_best = 0;
  for (size_t i = 0; i < all.size(); ++i)
    if (std::strncmp(all[i].name, "memcpy", 6) == 0)
      memcpy_best = std::max(memcpy_best, collector.best(names[i], "BYTES"));
  std::printf(
      "\n16M f32 elements (64 MiB per tensor), %d threads; GB/s = bytes that must move / time, "
      "best of %d round(s); ratio to the faster memcpy (%.1f GB/s).\n\n",
      omp_get_max_threads(), rounds, memcpy_best * 1e-9);
  std::printf("%-20s %10s %10s %12s\n", "kernel", "MiB moved", "GB/s", "vs memcpy");
  for (size_t i = 0; i < all.size(); ++i) {
    double gbs = collector.best(names[i], "BYTES") * 1e-9;
    if (gbs == 0) continue;  // filtered out
    std::printf("%-20s %10.0f %10.2f %12.3f\n", all[i].name, all[i].bytes / (1 << 20), gbs,
                memcpy_best > 0 ? gbs * 1e9 / memcpy_best : 0.0);
  }
  benchmark::Shutdown();
  return 0;
}
