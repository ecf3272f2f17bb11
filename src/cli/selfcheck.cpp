// `myriad selfcheck`: runs every op forward and backward through its reference implementation and
// through the optimised kernels on the same random inputs, and prints the largest difference and
// the speed-up of each. Exits non-zero when an op disagrees with its reference.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/autograd.h"
#include "core/random.h"
#include "ops/ops.h"

namespace myriad::cli {
namespace {

struct Case {
  std::string name;
  std::function<std::vector<Tensor>(Generator&, int)> inputs;  // floating ones get gradients
  std::function<Tensor(const std::vector<Tensor>&)> fn;
};

struct Result {
  std::vector<double> out, grads;
  double seconds = 0;
};

Result run_case(const Case& c, const std::vector<Tensor>& base, bool reference, int reps) {
  std::optional<ops::ReferenceMode> ref;
  if (reference) ref.emplace();
  Result r;
  std::vector<double> times;
  for (int rep = 0; rep < reps; ++rep) {
    std::vector<Tensor> xs;
    for (const Tensor& t : base) {
      Tensor x = t.clone();
      if (is_floating(x.dtype())) x.requires_grad_();
      xs.push_back(x);
    }
    auto t0 = std::chrono::steady_clock::now();
    Tensor y = c.fn(xs);
    ops::sum(ops::mul(y, y)).backward();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    if (rep == 0) {
      r.out = y.to_doubles();
      for (const Tensor& x : xs)
        if (x.requires_grad() && x.grad().defined()) {
          auto g = x.grad().to_doubles();
          r.grads.insert(r.grads.end(), g.begin(), g.end());
        }
    }
  }
  std::sort(times.begin(), times.end());
  r.seconds = times[times.size() / 2];
  return r;
}

// Largest |a - b| relative to the largest |b| (1 when b is all zero).
double rel_diff(const std::vector<double>& a, const std::vector<double>& b) {
  double scale = 1e-30, worst = 0;
  for (double v : b) scale = std::max(scale, std::abs(v));
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    worst = std::max(worst, std::abs(a[i] - b[i]));
  return a.size() == b.size() ? worst / std::max(scale, 1e-12) : INFINITY;
}

std::vector<Case> cases() {
  using V = std::vector<Tensor>;
  auto f = [](Generator& g, Shape s) { return g.normal(s, 0, 1); };
  return {
      {"add (broadcast)",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 1024}), f(g, {1024})};
       },
       [](const V& x) { return ops::add(x[0], x[1]); }},
      {"silu",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 1024})};
       },
       [](const V& x) { return ops::silu(x[0]); }},
      {"sum (rows)",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 1024})};
       },
       [](const V& x) { return ops::sum(x[0], {0}); }},
      {"softmax",
       [&](Generator& g, int n) {
         return V{f(g, {64 * n, 4096})};
       },
       [](const V& x) { return ops::softmax(x[0], -1); }},
      {"rms_norm",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 1024}), f(g, {1024})};
       },
       [](const V& x) { return ops::rms_norm(x[0], x[1], 1e-5); }},
      {"matmul",
       [&](Generator& g, int n) {
         return V{f(g, {128 * n, 256}), f(g, {256, 512})};
       },
       [](const V& x) { return ops::matmul(x[0], x[1]); }},
      {"linear_cross_entropy",
       [&](Generator& g, int n) {
         return V{f(g, {64 * n, 128}), f(g, {2000, 128}), g.randint({64 * n}, 0, 2000)};
       },
       [](const V& x) { return ops::linear_cross_entropy(x[0], x[1], x[2], 32); }},
      {"embedding",
       [&](Generator& g, int n) {
         return V{f(g, {1000, 256}), g.randint({512 * n}, 0, 1000)};
       },
       [](const V& x) { return ops::embedding(x[0], x[1]); }},
      {"topk",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 512})};
       },
       [](const V& x) { return ops::topk(x[0], 8).values; }},
      {"cumsum",
       [&](Generator& g, int n) {
         return V{f(g, {64 * n, 2048})};
       },
       [](const V& x) { return ops::cumsum(x[0], 1); }},
      {"conv1d_causal",
       [&](Generator& g, int n) {
         return V{f(g, {2, 512 * n, 256}), f(g, {256, 4})};
       },
       [](const V& x) { return ops::conv1d_causal(x[0], x[1]); }},
      {"kda (chunked)",
       [&](Generator& g, int n) {
         return V{f(g, {1, 128 * n, 2, 32}), f(g, {1, 128 * n, 2, 32}), f(g, {1, 128 * n, 2, 32}),
                  f(g, {1, 128 * n, 2, 32}), f(g, {1, 128 * n, 2})};
       },
       [](const V& x) {
         return ops::kda(ops::l2norm(x[0]), ops::l2norm(x[1]), x[2], ops::neg(ops::softplus(x[3])),
                         ops::sigmoid(x[4]))
             .o;
       }},
      {"attention (causal)",
       [&](Generator& g, int n) {
         return V{f(g, {1, 4, 128 * n, 32}), f(g, {1, 4, 128 * n, 32}), f(g, {1, 4, 128 * n, 32})};
       },
       [](const V& x) { return ops::attention(x[0], x[1], x[2], 1.0 / std::sqrt(32.0), true); }},
      {"situ_glu",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 512}), f(g, {256 * n, 512})};
       },
       [](const V& x) { return ops::situ_glu(x[0], x[1]); }},
      {"attn_res",
       [&](Generator& g, int n) {
         return V{f(g, {256 * n, 256}), f(g, {256 * n, 256}), f(g, {256 * n, 256}), f(g, {256}),
                  f(g, {256})};
       },
       [](const V& x) {
         return ops::attn_res({x[0], x[1], x[2]}, x[3], x[4]);
       }},
      {"gather",
       [&](Generator& g, int n) {
         return V{f(g, {64 * n, 512}), g.randint({64 * n, 64}, 0, 512)};
       },
       [](const V& x) { return ops::gather(x[0], 1, x[1]); }},
  };
}

}  // namespace

int selfcheck(const SelfcheckOptions& opt) {
  std::printf("myriad selfcheck: every op, forward + backward, optimised kernels vs reference\n");
  std::printf("%-22s %12s %12s %12s %12s %9s\n", "op", "out diff", "grad diff", "ref ms", "cpu ms",
              "speed-up");
  int failures = 0;
  double total_ref = 0, total_cpu = 0;
  for (const Case& c : cases()) {
    Generator g(1234);
    std::vector<Tensor> in = c.inputs(g, opt.scale);
    Result ref = run_case(c, in, /*reference=*/true, opt.reps);
    Result cpu = run_case(c, in, /*reference=*/false, opt.reps);
    double dout = rel_diff(cpu.out, ref.out), dgrad = rel_diff(cpu.grads, ref.grads);
    bool ok = dout < 1e-4 && dgrad < 1e-4;
    failures += !ok;
    total_ref += ref.seconds;
    total_cpu += cpu.seconds;
    std::printf("%-22s %12.2e %12.2e %12.3f %12.3f %8.1fx%s\n", c.name.c_str(), dout, dgrad,
                ref.seconds * 1e3, cpu.seconds * 1e3, ref.seconds / cpu.seconds,
                ok ? "" : "  MISMATCH");
  }
  std::printf("total: reference %.1f ms, optimised %.1f ms (%.1fx); %d op(s) disagree\n",
              total_ref * 1e3, total_cpu * 1e3, total_ref / total_cpu, failures);
  return failures ? 1 : 0;
}

}  // namespace myriad::cli
