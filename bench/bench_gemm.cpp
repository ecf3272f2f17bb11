// GEMM throughput: Myriad's ops::matmul (checks, output allocation, dispatch, primitive cache)
// next to a oneDNN matmul primitive called directly (created once, outside the timing loop), in
// f32 and bf16. The two are registered alternately, in rounds of alternating order, so machine
// noise hits both alike; the summary keeps each one's best round.
//
//   OMP_NUM_THREADS=2 bench_gemm [--rounds=3] [--min_time=0.3]
// (environment: MYRIAD_BENCH_ROUNDS, MYRIAD_BENCH_MIN_TIME), plus Google Benchmark's own flags.
// Fractions of peak are against the measured FMA / bf16 dot-product peak (bench_util.h: AMX
// TDPBF16PS tiles for bf16 where the CPU has them), not a nominal clock.
#include <omp.h>

#include <array>
#include <cstdio>
#include <memory>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>

#include "bench_util.h"
#include "core/autograd.h"
#include "core/random.h"
#include "ops/matmul.h"
#include "ops/quant.h"

namespace myriad::bench {
namespace {

struct Case {
  int64_t m, n, k;
  DType dtype;
  bool linear = false;  // B stored [N, K] (nn.Linear's weight): Myriad runs ops::linear
  int bits = 0;  // 8 or 4: Myriad runs ops::linear_quant on B's int8 / int4 copy; oneDNN the f32 B
  int act = 0;   // 8: int8 activations too (w8a8)
  std::string label() const {
    return std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (linear ? "^T" : "");
  }
  std::string type() const {
    return act ? "w8a8" : bits ? "int" + std::to_string(bits) : std::string(dtype_name(dtype));
  }
  double flops() const { return 2.0 * m * n * k; }
  // Myriad's bytes of B (quantized: codes + f32 scales); oneDNN's are the f32 ones.
  double b_bytes(bool myriad = true) const {
    return double(n) * k *
           (bits && myriad ? bits / 8.0 + 4.0 / ops::kQuantGroup : dtype_size(dtype));
  }
};

// Inputs and the direct oneDNN primitive of one case, built on first use and kept.
struct State {
  Tensor a, b, c;  // c: oneDNN's output
  ops::QuantWeight q;
  bool myriad_warm = false;
  std::unique_ptr<dnnl::matmul> prim;
  std::unordered_map<int, dnnl::memory> args;
};

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

State& state_for(const Case& c) {
  static std::map<std::string, std::unique_ptr<State>> states;
  auto& s = states[c.label() + c.type()];
  if (!s) {
    s = std::make_unique<State>();
    Generator g(42);
    s->a = g.normal({c.m, c.k}, 0.0, 1.0, c.dtype);
    s->b = c.linear ? g.normal({c.n, c.k}, 0.0, 1.0, c.dtype)
                    : g.normal({c.k, c.n}, 0.0, 1.0, c.dtype);
    s->c = Tensor::zeros({c.m, c.n}, c.dtype);
    if (c.bits) s->q = ops::quantize(s->b, c.bits, c.act);
  }
  return *s;
}

void bench_myriad(benchmark::State& st, Case c) {
  State& s = state_for(c);
  NoGradGuard no_grad;
  auto run = [&] {
    if (c.bits) return ops::linear_quant(s.a, s.q);
    return c.linear ? ops::linear(s.a, s.b) : ops::matmul(s.a, s.b);
  };
  if (!s.myriad_warm) {  // primitive creation stays out of the timing
    run();
    s.myriad_warm = true;
  }
  for (auto _ : st) {
    Tensor out = run();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  st.counters["FLOPS"] =
      benchmark::Counter(c.flops(), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["BYTES"] =
      benchmark::Counter(c.b_bytes(), benchmark::Counter::kIsIterationInvariantRate);
}

void bench_onednn(benchmark::State& st, Case c) {
  State& s = state_for(c);
  using tag = dnnl::memory::format_tag;
  static dnnl::stream stream(engine());
  if (!s.prim) {
    auto t = c.dtype == DType::F32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
    dnnl::memory::desc a({c.m, c.k}, t, tag::ab), b({c.k, c.n}, t, c.linear ? tag::ba : tag::ab),
        d({c.m, c.n}, t, tag::ab);
    dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, d), engine());
    s.prim = std::make_unique<dnnl::matmul>(pd);
    s.args = {{DNNL_ARG_SRC, dnnl::memory(a, engine(), s.a.data_ptr())},
              {DNNL_ARG_WEIGHTS, dnnl::memory(b, engine(), s.b.data_ptr())},
              {DNNL_ARG_DST, dnnl::memory(d, engine(), s.c.data_ptr())}};
    s.prim->execute(stream, s.args);  // warm-up
  }
  for (auto _ : st) {
    s.prim->execute(stream, s.args);
    stream.wait();
  }
  st.counters["FLOPS"] =
      benchmark::Counter(c.flops(), benchmark::Counter::kIsIterationInvariantRate);
  st.counters["BYTES"] =
      benchmark::Counter(c.b_bytes(false), benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace
}  // namespace myriad::bench

int main(int argc, char** argv) {
  using namespace myriad;
  using namespace myriad::bench;
  const int rounds = static_cast<int>(take_flag(argc, argv, "rounds", "MYRIAD_BENCH_ROUNDS", 3));
  const double min_time = take_flag(argc, argv, "min_time", "MYRIAD_BENCH_MIN_TIME", 0.3);
  const int threads = omp_get_max_threads();

  std::vector<Case> cases;
  for (DType t : {DType::F32, DType::BF16})
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {512, 512, 512}, {2048, 2048, 2048}, {4096, 1024, 4096}, {64, 4096, 4096}})
      cases.push_back({m, n, k, t});
  // Decode shapes (a token per sequence against an nn.Linear weight): memory-bound, with the GB/s
  // of B read; 65536 x 512 (128 MiB) does not fit in any cache.
  for (DType t : {DType::F32, DType::BF16})
    for (auto [m, n, k, lin] : std::vector<std::array<int64_t, 4>>{{1, 1024, 512, 1},
                                                                   {1, 4096, 1024, 1},
                                                                   {4, 4096, 1024, 1},
                                                                   {16, 4096, 1024, 1},
                                                                   {16, 1536, 512, 1},
                                                                   {1, 65536, 512, 1}})
      cases.push_back({m, n, k, t, lin != 0});
  // The same decode shapes with weight-only int8 and int4 B (ops/quant.h), and int8 B with int8
  // activations, against oneDNN's f32.
  for (auto [bits, act] : std::vector<std::array<int, 2>>{{8, 0}, {4, 0}, {8, 8}})
    for (auto [m, n, k] : std::vector<std::array<int64_t, 3>>{
             {1, 4096, 1024}, {4, 4096, 1024}, {16, 4096, 1024}, {1, 65536, 512}})
      cases.push_back({m, n, k, DType::F32, true, bits, act});
  // names[case][0] = Myriad's runs, [1] = oneDNN's.
  std::vector<std::array<std::vector<std::string>, 2>> names(cases.size());
  for (int r = 0; r < rounds; ++r)
    for (size_t i = 0; i < cases.size(); ++i)
      for (int j = 0; j < 2; ++j) {
        const int impl = (j + r) % 2;  // alternate which goes first
        const Case& c = cases[i];
        std::string name = std::string(impl == 0 ? "myriad" : "onednn") + "/" + c.type() + "/" +
                           c.label() + "/round:" + std::to_string(r);
        names[i][impl].push_back(name);
        auto* b = impl == 0 ? benchmark::RegisterBenchmark(name.c_str(), bench_myriad, c)
                            : benchmark::RegisterBenchmark(name.c_str(), bench_onednn, c);
        b->UseRealTime()->MinTime(min_time)->Unit(benchmark::kMillisecond);
      }

  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);

  const double peak_f32 = measured_peak_gflops(false), peak_bf16 = measured_peak_gflops(true);
  std::printf(
      "\nMeasured peak (independent chains on %d threads): %.1f GFLOP/s f32 (%s), %.1f GFLOP/s "
      "bf16 (%s).\nGFLOP/s are each implementation's best of %d round(s).\n\n",
      threads, peak_f32, peak_method(false), peak_bf16, peak_method(true), rounds);
  std::printf("%-16s %-5s %14s %14s %14s %12s %12s\n", "M x N x K", "dtype", "Myriad GFLOP/s",
              "oneDNN GFLOP/s", "Myriad/oneDNN", "Myriad peak", "oneDNN peak");
  std::printf(
      "(^T: B stored [N, K] as nn.Linear's weight; M <= 16 rows add the GB/s of B read;\n"
      " int8 / int4 / w8a8: Myriad's linear_quant on quantized B against oneDNN's f32 B)\n");
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    double my = collector.best(names[i][0], "FLOPS") * 1e-9;
    double dn = collector.best(names[i][1], "FLOPS") * 1e-9;
    if (my == 0 && dn == 0) continue;  // filtered out
    double peak = c.dtype == DType::F32 ? peak_f32 : peak_bf16;
    std::printf("%-16s %-5s %14.1f %14.1f %14.3f %11.1f%% %11.1f%%", c.label().c_str(),
                c.type().c_str(), my, dn, dn > 0 ? my / dn : 0.0, peak > 0 ? 100 * my / peak : 0.0,
                peak > 0 ? 100 * dn / peak : 0.0);
    if (c.m <= 16)
      std::printf("   B read: Myriad %.1f GB/s, oneDNN %.1f GB/s",
                  collector.best(names[i][0], "BYTES") * 1e-9,
                  collector.best(names[i][1], "BYTES") * 1e-9);
    std::printf("\n");
  }
  benchmark::Shutdown();
  return 0;
}
