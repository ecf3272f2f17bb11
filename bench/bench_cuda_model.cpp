// The model on one CUDA device, against the H200 figures of docs/ANCHORS.md (§3: transformers
// kimi_linear on the `medium` shape; §4: fla / FlashKDA KDA kernels). Three parts, each timed with
// the device synchronised around it and reported even when another part fails:
//   kda     the KDA op at FlashKDA's benchmark shape (B1 T8192 H96 D128, bf16): forward, and
//           forward + backward (autograd through ops::kda);
//   train   the model's loss forward + backward with bf16 weights on the device (no optimizer
//           step: the trainer is not device-resident yet): tokens/s and MFU by the planner's
//           FLOP count (llm.c convention, 3 x forward) against the 989 TFLOP/s bf16 peak;
//   decode  batch-1 prefill of C tokens through the cache (4K-token chunks), then one-token
//           steps: tokens/s, and the HBM fraction of the bytes a step must read (bf16 weights of
//           the active parameters + the MLA latent cache + the KDA states) at 4.8 TB/s.
// Exits 0 printing "no CUDA device" when there is none.
//
//   bench_cuda_model [config=configs/medium] [parts=kda,train,decode] [batch=2] [seq=4096]
//                    [contexts=8192,32768,65536] [steps=32]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/random.h"
#include "model/decoder.h"
#include "ops/ops.h"
#include "plan/params.h"
#include "plan/roofline.h"
#ifdef MYRIAD_HAVE_CUDA
#include "backend/cuda/cuda.h"
#endif

namespace myriad {
namespace {

#ifdef MYRIAD_HAVE_CUDA
constexpr double kPeakFlops = 989e12, kHbmBytesPerSecond = 4.8e12;

double seconds_of(const std::function<void()>& f) {
  gpu::synchronize(0);
  const auto t0 = std::chrono::steady_clock::now();
  f();
  gpu::synchronize(0);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::vector<int64_t> int_list(const std::string& s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) v.push_back(std::stoll(part));
  return v;
}

void bench_kda() {
  const int64_t B = 1, T = 8192, H = 96, D = 128;
  Generator gen(1);
  const Device dev = cuda(0);
  auto make = [&](const Shape& s, double scale, DType t) {
    return gen.normal(s, 0.0, scale, DType::F32).to(t).to(dev);
  };
  Tensor q = make({B, T, H, D}, 1.0, DType::BF16),
         k = ops::l2norm(make({B, T, H, D}, 1.0, DType::BF16));
  Tensor v = make({B, T, H, D}, 1.0, DType::BF16);
  Tensor g = ops::mul(ops::sigmoid(make({B, T, H, D}, 1.0, DType::F32)),
                      Tensor::full({1}, -0.1, DType::F32, dev));
  Tensor beta = ops::sigmoid(make({B, T, H}, 1.0, DType::F32));
  double fwd = 1e30, both = 1e30;
  {
    NoGradGuard ng;
    ops::kda(q, k, v, g, beta);  // warm-up
    for (int r = 0; r < 3; ++r)
      fwd = std::min(fwd, seconds_of([&] { ops::kda(q, k, v, g, beta); }));
  }
  for (Tensor* t : {&q, &k, &v, &g, &beta}) t->requires_grad_(true);
  const Tensor R = make({B, T, H, D}, 1.0, DType::BF16);
  auto step = [&] {
    Tensor o = ops::kda(q, k, v, g, beta).o;
    ops::sum(ops::mul(o, R)).backward();
  };
  step();
  for (int r = 0; r < 3; ++r) both = std::min(both, seconds_of(step));
  std::printf(
      "| kda B%lld T%lld H%lld D%lld bf16 | forward %.2f ms | forward+backward %.2f ms |"
      " fla chunk_kda forward: 4.84 ms (H20), 2.33 ms (GB200); FlashKDA 1.01 ms (GB200) |\n",
      static_cast<long long>(B), static_cast<long long>(T), static_cast<long long>(H),
      static_cast<long long>(D), fwd * 1e3, both * 1e3);
}

void bench_train(const model::ModelConfig& c, int64_t batch, int64_t seq) {
  model::Decoder host = model::Decoder::random(c, 1, DType::BF16);
  model::Decoder m(c, host.weights().to(cuda(0)));
  m.weights().requires_grad_(true);
  Generator gen(2);
  const Tensor ids = gen.randint({batch, seq}, 0, c.vocab_size).to(cuda(0));
  auto step = [&] {
    for (const auto& [n, t] : m.weights().tensors()) Tensor(t).zero_grad();
    m.loss(ids).backward();
  };
  step();  // warm-up: plans, allocator
  double best = 1e30;
  for (int r = 0; r < 3; ++r) best = std::min(best, seconds_of(step));
  const plan::ParamCounts pc = plan::count_params(c);
  const double flops = 3 * plan::forward_flops_per_token(c, pc, seq).total();
  const double tps = static_cast<double>(batch * seq) / best;
  std::printf(
      "| train fwd+bwd B%lld x T%lld bf16 | %.3f s/step | %.0f tok/s | MFU %.1f%% |"
      " transformers kimi_linear: 3,960 tok/s (with AdamW) |\n",
      static_cast<long long>(batch), static_cast<long long>(seq), best, tps,
      100.0 * tps * flops / kPeakFlops);
}

void bench_decode(const model::ModelConfig& c, const std::vector<int64_t>& contexts,
                  int64_t steps) {
  model::Decoder host = model::Decoder::random(c, 3, DType::BF16);
  model::Decoder m(c, host.weights().to(cuda(0)));
  const plan::ParamCounts pc = plan::count_params(c);
  const plan::CacheFootprint fp = plan::cache_footprint(c, 4);  // f32 KDA state
  NoGradGuard ng;
  Generator gen(4);
  const std::map<int64_t, double> peer = {{8192, 7.7}, {32768, 13.6}, {65536, 8.4}};
  for (int64_t ctx : contexts) {
    const Tensor ids = gen.randint({1, ctx + steps}, 0, c.vocab_size).to(cuda(0));
    model::DecodeCache cache = m.new_cache();
    const int64_t chunk = 4096;
    const double prefill = seconds_of([&] {
      for (int64_t t = 0; t < ctx; t += chunk)
        m.forward(ops::contiguous(ops::slice(ids, 1, t, std::min(ctx, t + chunk))), &cache);
    });
    const double decode = seconds_of([&] {
      for (int64_t s = 0; s < steps; ++s)
        m.forward(ops::contiguous(ops::slice(ids, 1, ctx + s, ctx + s + 1)), &cache);
    });
    const double tps = static_cast<double>(steps) / decode;
    const double bytes = 2.0 * static_cast<double>(pc.active) +
                         static_cast<double>(fp.mla_bytes_per_token) * (ctx + steps / 2.0) +
                         static_cast<double>(fp.kda_state_bytes + fp.kda_conv_bytes);
    const auto p = peer.find(ctx);
    std::printf(
        "| decode batch 1 at %lld ctx | prefill %.0f tok/s | decode %.1f tok/s | %.2f%% of"
        " HBM bandwidth (%.1f MB/step) | transformers: %s tok/s |\n",
        static_cast<long long>(ctx), static_cast<double>(ctx) / prefill, tps,
        100.0 * bytes * tps / kHbmBytesPerSecond, bytes / 1e6,
        p == peer.end() ? "-" : std::to_string(p->second).substr(0, 4).c_str());
    std::fflush(stdout);
  }
}
#endif

int run(int argc, char** argv) {
  std::map<std::string, std::string> a = {{"config", "configs/medium"},
                                          {"parts", "kda,train,decode"},
                                          {"batch", "2"},
                                          {"seq", "4096"},
                                          {"contexts", "8192,32768,65536"},
                                          {"steps", "32"}};
  for (int i = 1; i < argc; ++i) {
    const std::string s = argv[i];
    const auto eq = s.find('=');
    if (eq == std::string::npos || !a.count(s.substr(0, eq))) {
      std::fprintf(stderr, "bench_cuda_model: unknown argument '%s'\n", argv[i]);
      return 2;
    }
    a[s.substr(0, eq)] = s.substr(eq + 1);
  }
#ifdef MYRIAD_HAVE_CUDA
  if (!has_allocator(DeviceType::CUDA)) {
    std::printf("no CUDA device\n");
    return 0;
  }
  const model::ModelConfig c = model::ModelConfig::load(a["config"]);
  int failed = 0;
  auto part = [&](const std::string& name, const std::function<void()>& f) {
    if (a["parts"].find(name) == std::string::npos) return;
    try {
      f();
    } catch (const std::exception& e) {
      std::printf("| %s | FAILED: %s |\n", name.c_str(), e.what());
      ++failed;
    }
    std::fflush(stdout);
  };
  part("kda", [&] { bench_kda(); });
  part("train", [&] { bench_train(c, std::stoll(a["batch"]), std::stoll(a["seq"])); });
  part("decode", [&] { bench_decode(c, int_list(a["contexts"]), std::stoll(a["steps"])); });
  return failed ? 1 : 0;
#else
  std::printf("no CUDA device (built without the CUDA backend)\n");
  return 0;
#endif
}

}  // namespace
}  // namespace myriad

int main(int argc, char** argv) {
  return myriad::run(argc, argv);
}
