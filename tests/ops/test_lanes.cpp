// The hand-written CPU kernels (flash attention, KDA, the few-row GEMM) run 16-lane vectors on
// AVX-512 CPUs and 8-lane ones elsewhere (backend/cpu/cpu.h, Lanes). Every sum keeps its order
// whatever the width, so both widths must give the same bits: forward and backward, f32 and bf16.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/attention.h"
#include "ops/kda.h"
#include "ops/matmul.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

// f(leaves) run with 8 and with 16 lanes: the output and every leaf's gradient, bit for bit.
void expect_same_bits(const std::string& what, const std::vector<Tensor>& inputs,
                      const std::function<Tensor(const std::vector<Tensor>&)>& f) {
  std::vector<std::vector<double>> runs;
  for (int w : {8, 16}) {
    cpu::force_lanes(w);
    std::vector<Tensor> x;
    for (const Tensor& t : inputs) x.push_back(t.detach().clone().requires_grad_());
    Tensor y = f(x);
    y.backward(randn(y.shape(), 5).to(y.dtype()));
    runs.push_back(y.to_doubles());
    for (const Tensor& t : x) {
      std::vector<double> g = t.grad().to_doubles();
      runs.back().insert(runs.back().end(), g.begin(), g.end());
    }
  }
  cpu::force_lanes(0);
  ASSERT_EQ(runs[0].size(), runs[1].size()) << what;
  size_t differ = 0;
  for (size_t i = 0; i < runs[0].size(); ++i) differ += runs[0][i] != runs[1][i];
  EXPECT_EQ(differ, 0u) << what << ": " << differ << " of " << runs[0].size() << " values differ";
}

TEST(VectorWidth, AttentionKdaAndFewRowGemmGiveTheSameBits) {
  for (DType t : {DType::F32, DType::BF16}) {
    const auto in = [&](const Shape& s, uint64_t seed) { return randn(s, seed).to(t); };
    // GQA with 3 rows per kv head, 70 keys (a partial tile), Dk 40 and Dv 24 (padded to 48 / 32).
    expect_same_bits(cat("attention ", dtype_name(t)),
                     {in({2, 6, 37, 40}, 1), in({2, 2, 70, 40}, 2), in({2, 2, 70, 24}, 3)},
                     [](const std::vector<Tensor>& x) {
                       return ops::attention(x[0], x[1], x[2], 0.3, true, 33);
                     });
    // KDA with log-decays of both signs, so both the factorised and the direct blocks run.
    expect_same_bits(
        cat("kda ", dtype_name(t)),
        {ops::l2norm(in({1, 80, 2, 32}, 10)), ops::l2norm(in({1, 80, 2, 32}, 11)),
         in({1, 80, 2, 32}, 12), ops::add(ops::mul(in({1, 80, 2, 32}, 13), 0.1), -0.05),
         ops::sigmoid(in({1, 80, 2}, 14))},
        [](const std::vector<Tensor>& x) {
          return ops::kda(x[0], x[1], x[2], x[3], x[4], Tensor(), -1, 32).o;
        });
    // A few rows against B stored [n, k] (the decode GEMM), k with a tail of 5.
    for (int64_t m : {1, 3, 6})
      expect_same_bits(cat("few-row gemm m ", m, " ", dtype_name(t)),
                       {in({m, 37}, 20 + m), in({9, 37}, 30)}, [](const std::vector<Tensor>& x) {
                         return ops::matmul(x[0], ops::transpose(x[1], 0, 1));
                       });
  }
}

// cpu::FlushSubnormals flushes subnormal floats to zero in its thread while it lives, and
// restores the thread's mode after (KDA's kernels hold one: an operation on a subnormal costs a
// ~100-cycle assist on Intel CPUs, which held KDA at 1/15 of its speed).
TEST(CpuThreads, FlushSubnormalsIsScoped) {
#if defined(__x86_64__)
  if (const char* v = std::getenv("MYRIAD_DENORMALS"); v && std::string(v) == "keep")
    GTEST_SKIP() << "MYRIAD_DENORMALS=keep";
  volatile float tiny = 1e-39f;  // subnormal
  EXPECT_NE(tiny * 1.0f, 0.0f);
  {
    cpu::FlushSubnormals flush;
    EXPECT_EQ(tiny * 1.0f, 0.0f);  // read as zero
    EXPECT_EQ(tiny * 0.5f, 0.0f);
    volatile float small = 1e-30f;  // normal, with a subnormal product: flushed to zero
    EXPECT_EQ(small * 1e-10f, 0.0f);
  }
  EXPECT_NE(tiny * 1.0f, 0.0f);
#else
  GTEST_SKIP() << "x86 only";
#endif
}

// Heavy items (a KDA head's whole sequence) split over the threads whatever the wait policy;
// parallel_for asks 16 times the grain when idle threads sleep (OMP_WAIT_POLICY=passive, as the
// test runner and scripts/main.sh set), which had left KDA's training kernels on one thread.
TEST(CpuThreads, HeavyItemsSplitWhateverTheWaitPolicy) {
  if (omp_get_max_threads() < 2) GTEST_SKIP() << "needs 2 OpenMP threads";
  const auto ranges = [](auto&& run) {
    std::vector<std::pair<int64_t, int64_t>> seen(8, {-1, -1});
    run([&](int64_t b, int64_t e) { seen[omp_get_thread_num()] = {b, e}; });
    int n = 0;
    for (auto [b, e] : seen) n += b >= 0;
    return n;
  };
  EXPECT_EQ(ranges([](auto f) { cpu::parallel_split(4, 1, f); }), 2);
  EXPECT_EQ(ranges([](auto f) { cpu::parallel_for(4, 1, f); }), cpu::threads_sleep() ? 1 : 2);
}

// The branch-free softplus the CPU unary kernel vectorises (libm's log1pf does not): within 8 ulp
// of log1p(exp(x)) in double wherever that is a normal float, x itself above 20.
TEST(CpuMath, FastSoftplusIsCloseToLog1pExp) {
  double worst = 0;
  for (double x = -80; x <= 80; x += 1.0 / 1024) {
    const float xf = static_cast<float>(x), y = cpu::fast_softplus(xf);
    const double want = std::log1p(std::exp(static_cast<double>(xf)));
    const double rel = std::fabs(y - want) / want;
    worst = std::max(worst, rel);
    ASSERT_LT(rel, 8 * 5.97e-8) << "x " << xf << ": " << y << " against " << want;
    if (xf > 20) {
      ASSERT_EQ(y, xf);
    }
  }
  EXPECT_GT(worst, 0.0);  // not exact: the bound above is what is checked
  EXPECT_EQ(cpu::fast_softplus(-100.0f), 0.0f);
  EXPECT_EQ(cpu::fast_softplus(100.0f), 100.0f);
  EXPECT_EQ(cpu::fast_softplus(0.0f), static_cast<float>(std::log(2.0)));
}

// The CPU's f32 -> bf16 row conversion (on AVX512-BF16 CPUs one instruction per 32 values, which
// reads subnormals as zero) rounds every value as core/dtype.h's f32_to_bf16 does: random bit
// patterns (every exponent, so subnormals, infinities and NaNs too), halfway cases, and lengths
// and offsets around the 32-value blocks.
TEST(CpuMath, Bf16RowRoundingIsTheScalarRule) {
  std::mt19937 gen(11);
  std::vector<uint32_t> bits(4096);
  for (uint32_t& b : bits) b = static_cast<uint32_t>(gen());
  for (size_t i = 0; i < bits.size(); i += 7) bits[i] = (bits[i] & 0x807fffffu);  // subnormal or 0
  for (size_t i = 3; i < bits.size(); i += 11) bits[i] = (bits[i] & 0xffff0000u) | 0x8000u;  // tie
  for (size_t i = 5; i < bits.size(); i += 13) bits[i] |= 0x7f800000u;  // inf or NaN
  bits[1] = 0x7f7fffffu;  // the largest float: rounds to infinity
  bits[2] = 0x00800000u;  // the smallest normal
  bits[4] = 0x007fffffu;  // the largest subnormal: rounds up to the smallest normal bf16
  std::vector<float> x(bits.size());
  std::memcpy(x.data(), bits.data(), bits.size() * sizeof(float));
  std::vector<uint16_t> got(bits.size());
  for (int64_t off : {0, 1, 17})
    for (int64_t n : {0, 1, 31, 32, 33, 64, 95, 1000, 4000}) {
      std::fill(got.begin(), got.end(), uint16_t{0xdead});
      cpu::f32_row_to_bf16(x.data() + off, got.data() + off, n);
      for (int64_t i = 0; i < n; ++i)
        ASSERT_EQ(got[off + i], f32_to_bf16(x[off + i]))
            << "bits 0x" << std::hex << bits[off + i] << std::dec << " at " << i << " of " << n;
      if (off + n < static_cast<int64_t>(got.size())) {
        ASSERT_EQ(got[off + n], 0xdead) << "wrote past " << n;
      }
    }
}

}  // namespace
}  // namespace myriad::testing
