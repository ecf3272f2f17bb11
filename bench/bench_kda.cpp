// KDA on the CPU (MODEL.md §4): the chunked f32 kernel's forward and forward+backward against
// the recurrent reference, at B = 1, T = 4096, H = 4, K = V = 64, chunk 64 by default.
// FLOP/s use MODEL.md §4.4's count per head, 6 T d^2 + 3 T C d + T C^2, for the forward, and
// three times that for forward+backward (the usual convention; the fused backward does about
// twice the forward's work, recomputing the chunk quantities included). The backward is seeded
// with a fixed d_o, so the loop times the op and its autograd node alone.
//
//   OMP_NUM_THREADS=2 bench_kda [--T=4096] [--H=4] [--chunk=64] [--reference=1] [--bf16=0]
// (environment: MYRIAD_BENCH_KDA_T, ..._H, ..._CHUNK, ..._REFERENCE, ..._BF16), plus Google
// Benchmark's flags. The reference is slow (~seconds); --reference=0 skips it. --bf16=1 gives the
// kernel bf16 q, k, v (bf16 training's inputs; on AMX CPUs its 64-deep products run on the tile
// unit) and skips the reference.
#include <cstdio>
#include <optional>

#include "bench_util.h"
#include "core/autograd.h"
#include "core/random.h"
#include "ops/elementwise.h"
#include "ops/kda.h"
#include "ops/reduce.h"
#include "ops/shape.h"

namespace myriad::bench {
namespace {

int64_t g_T = 4096, g_H = 4, g_chunk = 64;
bool g_bf16 = false;
constexpr int64_t kB = 1, kD = 64;

struct Inputs {
  Tensor q, k, v, g, beta, h0, w;
};
Inputs& inputs() {
  static Inputs in = [] {
    NoGradGuard ng;
    Generator gen(3);
    Inputs r;
    r.q = ops::l2norm(gen.normal({kB, g_T, g_H, kD}, 0, 1));
    r.k = ops::l2norm(gen.normal({kB, g_T, g_H, kD}, 0, 1));
    r.v = gen.normal({kB, g_T, g_H, kD}, 0, 1);
    r.g = ops::reshape(ops::kda_gate_lower_bound(gen.normal({kB, g_T, g_H * kD}, 0, 1),
                                                 Tensor::zeros({g_H}), Tensor()),
                       {kB, g_T, g_H, kD});
    r.beta = ops::sigmoid(gen.normal({kB, g_T, g_H}, 0, 1));
    r.h0 = gen.normal({kB, g_H, kD, kD}, 0, 0.1);
    r.w = gen.normal({kB, g_T, g_H, kD}, 0, 1);
    if (g_bf16)  // bf16 training's inputs (the gate and beta stay f32)
      for (Tensor* t : {&r.q, &r.k, &r.v, &r.w}) *t = t->to(DType::BF16);
    return r;
  }();
  return in;
}

double forward_flops() {
  const double T = g_T, d = kD, C = g_chunk;
  return kB * g_H * (6 * T * d * d + 3 * T * C * d + T * C * C);
}

void run_kda(benchmark::State& st, bool backward, bool reference) {
  Inputs& in = inputs();
  auto body = [&] {
    std::optional<ops::ReferenceMode> ref;
    if (reference) ref.emplace();
    std::vector<Tensor> xs = {in.q, in.k, in.v, in.g, in.beta, in.h0};
    if (backward)
      for (Tensor& x : xs) x = x.detach().requires_grad_();
    ops::KdaOutput r = ops::kda(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], -1, g_chunk);
    if (backward) {
      // Seeded with w: the kernel gets d_o = w (and a zero final-state gradient) without a loss
      // op's forward and backward in the timed loop (a mul, sums and their backwards were about
      // 13% of it).
      r.o.backward(in.w);
      benchmark::DoNotOptimize(xs[1].grad().data_ptr());
    }
    benchmark::DoNotOptimize(r.o.data_ptr());
  };
  if (!reference) body();  // warm-up
  for (auto _ : st) body();
  st.counters["FLOPS"] = benchmark::Counter(forward_flops() * (backward ? 3 : 1),
                                            benchmark::Counter::kIsIterationInvariantRate);
}

void KdaForward(benchmark::State& st) {
  run_kda(st, false, false);
}
void KdaForwardBackward(benchmark::State& st) {
  run_kda(st, true, false);
}
void KdaReferenceForward(benchmark::State& st) {
  run_kda(st, false, true);
}
void KdaReferenceForwardBackward(benchmark::State& st) {
  run_kda(st, true, true);
}

}  // namespace
}  // namespace myriad::bench

int main(int argc, char** argv) {
  using namespace myriad::bench;
  g_T = static_cast<int64_t>(take_flag(argc, argv, "T", "MYRIAD_BENCH_KDA_T", 4096));
  g_H = static_cast<int64_t>(take_flag(argc, argv, "H", "MYRIAD_BENCH_KDA_H", 4));
  g_chunk = static_cast<int64_t>(take_flag(argc, argv, "chunk", "MYRIAD_BENCH_KDA_CHUNK", 64));
  g_bf16 = take_flag(argc, argv, "bf16", "MYRIAD_BENCH_KDA_BF16", 0) != 0;
  const bool reference =
      !g_bf16 && take_flag(argc, argv, "reference", "MYRIAD_BENCH_KDA_REFERENCE", 1) != 0;
  benchmark::Initialize(&argc, argv);
  benchmark::RegisterBenchmark("KdaForward", KdaForward)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  benchmark::RegisterBenchmark("KdaForwardBackward", KdaForwardBackward)
      ->Unit(benchmark::kMillisecond)
      ->UseRealTime();
  if (reference) {
    benchmark::RegisterBenchmark("KdaReferenceForward", KdaReferenceForward)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
    benchmark::RegisterBenchmark("KdaReferenceForwardBackward", KdaReferenceForwardBackward)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime()
        ->Iterations(1);
  }
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  const double fwd = collector.best({"KdaForward"}, "FLOPS") * 1e-9;
  const double fb = collector.best({"KdaForwardBackward"}, "FLOPS") * 1e-9;
  std::printf("\nKDA B=%lld T=%lld H=%lld K=V=%lld chunk %lld, %s inputs, %d threads\n",
              static_cast<long long>(kB), static_cast<long long>(g_T), static_cast<long long>(g_H),
              static_cast<long long>(kD), static_cast<long long>(g_chunk), g_bf16 ? "bf16" : "f32",
              omp_get_max_threads());
  std::printf("  chunked forward           %8.2f GFLOP/s (MODEL.md count)\n", fwd);
  std::printf("  chunked forward+backward  %8.2f GFLOP/s (3x the forward count)\n", fb);
  if (reference) {
    const double rf = collector.best({"KdaReferenceForwardBackward"}, "FLOPS") * 1e-9;
    std::printf("  reference fwd+bwd         %8.2f GFLOP/s; chunked is %.1fx faster\n", rf,
                rf > 0 ? fb / rf : 0.0);
  }
  benchmark::Shutdown();
  return 0;
}
