// The AMX-BF16 tile products (backend/cpu/amx.h) and the bf16 flash attention and KDA chunk
// products that run on them:
// against plain sums in f64 and against the f32 reference on the same bf16 values. Skipped on
// CPUs without AMX (and with MYRIAD_AMX=0).
#include "backend/cpu/amx.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "ops/attention.h"
#include "ops/elementwise.h"
#include "ops/kda.h"
#include "ops/shape.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

std::vector<uint16_t> random_bf16(int64_t n, uint64_t seed) {
  std::vector<double> x = randn({n}, seed).to_doubles();
  std::vector<uint16_t> h(n);
  for (int64_t i = 0; i < n; ++i) h[i] = f32_to_bf16(static_cast<float>(x[i]));
  return h;
}

// Every packing route into amx_gemm, with sizes that need padding, against f64 sums.
TEST(Amx, PackedProductsMatchPlainSums) {
  if (!cpu::amx_bf16()) GTEST_SKIP() << "no AMX-BF16 here";
  for (auto [M, N, K] : {std::tuple<int64_t, int64_t, int64_t>{1, 1, 1},
                         {16, 16, 32},
                         {17, 40, 33},
                         {64, 64, 64},
                         {37, 24, 96},
                         {5, 7, 3}}) {
    const int64_t Mp = (M + 15) / 16 * 16, Np = (N + 15) / 16 * 16, Kp = (K + 31) / 32 * 32;
    std::vector<uint16_t> a = random_bf16(M * K, 1 + M),
                          b = random_bf16(K * N, 2 + N);  // [M,K] [K,N]
    std::vector<uint16_t> bt(N * K);                      // B transposed, [N, K]
    for (int64_t k = 0; k < K; ++k)
      for (int64_t n = 0; n < N; ++n) bt[n * K + k] = b[k * N + n];
    std::vector<const uint16_t*> arows(M), brows(K), btrows(N);
    for (int64_t m = 0; m < M; ++m) arows[m] = a.data() + m * K;
    for (int64_t k = 0; k < K; ++k) brows[k] = b.data() + k * N;
    for (int64_t n = 0; n < N; ++n) btrows[n] = bt.data() + n * K;
    std::vector<float> af(M * K), aft(64 * 64, 0.0f);  // A as f32, and Aᵀ in a 64 x 64 tile
    for (int64_t i = 0; i < M * K; ++i) af[i] = bf16_to_f32(a[i]);
    for (int64_t m = 0; m < std::min<int64_t>(M, 64); ++m)
      for (int64_t k = 0; k < std::min<int64_t>(K, 64); ++k) aft[k * 64 + m] = af[m * K + k];
    std::vector<double> want(M * N, 0.0);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t k = 0; k < K; ++k)
          want[m * N + n] += static_cast<double>(af[m * K + k]) * bf16_to_f32(b[k * N + n]);

    std::vector<uint16_t> pa(Mp * Kp), pb(Kp * Np), pbt(Kp * Np);
    cpu::pack_pairs(brows.data(), K, N, pb.data(), Kp, Np);
    cpu::pack_pairs_t(btrows.data(), K, N, pbt.data(), Kp, Np);
    auto run = [&](const std::string& route, bool twice) {
      std::vector<float> c(Mp * Np, 0.0f);
      cpu::AmxTiles tiles;
      for (int rep = 0; rep < (twice ? 2 : 1); ++rep)
        cpu::amx_gemm(Mp, Np, Kp, pa.data(), Kp, route == "pairs_t" ? pbt.data() : pb.data(),
                      2 * Np, c.data(), Np, rep > 0);
      const double mul = twice ? 2 : 1;
      for (int64_t m = 0; m < M; ++m)
        for (int64_t n = 0; n < N; ++n)
          EXPECT_NEAR(c[m * Np + n], mul * want[m * N + n], 1e-5 * (1 + std::abs(want[m * N + n])))
              << route << " M" << M << " N" << N << " K" << K << " at " << m << "," << n;
    };
    cpu::pack_rows(arows.data(), M, K, pa.data(), Kp, Mp, Kp);
    run("rows", false);
    run("pairs_t", true);
    cpu::pack_rows(af.data(), K, M, K, pa.data(), Kp, Mp, Kp);
    run("f32 rows", false);
    if (M <= 64 && K <= 64) {
      cpu::pack_rows_t(aft.data(), 64, M, K, pa.data(), Kp, Mp, Kp);
      run("f32 rows transposed", false);
    }
  }
}

// bf16 attention, forward and backward, with its products on the tile unit: within bf16's
// rounding of the f32 reference on the same values, and about as close as the f32-product path
// (which rounds only the inputs and the output).
TEST(Amx, Bf16AttentionMatchesTheF32Reference) {
  if (!cpu::amx_bf16()) GTEST_SKIP() << "no AMX-BF16 here";
  struct Case {
    int64_t B, Hq, Hkv, Tq, Tk, Dk, Dv;
    bool causal;
    int64_t q_offset;
  };
  const std::vector<Case> cases = {
      {2, 4, 4, 130, 130, 96, 64, true, 0},  // the MLA training shape, partial tiles
      {1, 6, 2, 37, 70, 40, 24, true, 33},   // GQA, a causal tile starting mid-tile
      {1, 2, 1, 20, 150, 5, 7, false, 0},    // odd head dims, non-causal
      {1, 3, 1, 1, 200, 64, 48, true, 199},  // decode: one query row per head
  };
  uint64_t seed = 300;
  for (const Case& c : cases) {
    const std::string what = cat("Hq", c.Hq, " Hkv", c.Hkv, " Tq", c.Tq, " Tk", c.Tk, " Dk", c.Dk,
                                 " Dv", c.Dv, c.causal ? " causal" : "");
    const double scale = 1.0 / std::sqrt(static_cast<double>(c.Dk));
    std::vector<Tensor> x = {randn({c.B, c.Hq, c.Tq, c.Dk}, seed).to(DType::BF16),
                             randn({c.B, c.Hkv, c.Tk, c.Dk}, seed + 1).to(DType::BF16),
                             randn({c.B, c.Hkv, c.Tk, c.Dv}, seed + 2).to(DType::BF16)};
    const Tensor dy = randn({c.B, c.Hq, c.Tq, c.Dv}, seed + 3).to(DType::BF16);
    seed += 10;
    // Output then the q, k, v gradients, as doubles.
    auto run = [&](DType t, bool reference) {
      std::vector<Tensor> in;
      for (const Tensor& v : x) in.push_back(v.to(t).clone().requires_grad_());
      std::optional<ops::ReferenceMode> ref;
      if (reference) ref.emplace();
      Tensor y = ops::attention(in[0], in[1], in[2], scale, c.causal, c.q_offset);
      y.backward(dy.to(t));
      std::vector<std::vector<double>> out = {y.to_doubles()};
      for (const Tensor& v : in) out.push_back(v.grad().to_doubles());
      return out;
    };
    const auto want = run(DType::F32, true), amx = run(DType::BF16, false);
    cpu::force_amx_off(true);
    const auto vec = run(DType::BF16, false);
    cpu::force_amx_off(false);
    const char* names[] = {"out", "dq", "dk", "dv"};
    for (int i = 0; i < 4; ++i) {
      double peak = 0, err_amx = 0, err_vec = 0;
      for (size_t j = 0; j < want[i].size(); ++j) {
        peak = std::max(peak, std::abs(want[i][j]));
        err_amx = std::max(err_amx, std::abs(amx[i][j] - want[i][j]));
        err_vec = std::max(err_vec, std::abs(vec[i][j] - want[i][j]));
      }
      // bf16 keeps 8 bits: its output rounding alone is up to 2^-9 of the peak.
      EXPECT_LE(err_amx, 1.6e-2 * peak)
          << what << " " << names[i] << " (f32 products: " << err_vec << ", peak " << peak << ")";
      EXPECT_LE(err_amx, 4 * err_vec + 1e-3 * peak) << what << " " << names[i];
    }
  }
}

// bf16 KDA, forward and backward, with its products against the state, P Ṽ and the backward's
// products of dO, dS', Ṽ, X and nDR on the tile unit (backend/cpu/kda.cpp): within bf16's rounding
// of the f32 reference on the same values (a failure also prints the f32-product path's error).
// Several chunks with a carried state, padded head sizes (48 and 40: pad32 columns past the padded
// tiles), Kimi Linear's head size 128, a partial last chunk, and the three kinds of gate
// (factorised blocks, some direct blocks, all direct).
TEST(Amx, Bf16KdaMatchesTheF32Reference) {
  if (!cpu::amx_bf16()) GTEST_SKIP() << "no AMX-BF16 here";
  struct Case {
    int64_t B, T, H, K, V, chunk;
  };
  const std::vector<Case> cases = {
      {1, 200, 2, 64, 64, 64}, {2, 70, 1, 48, 40, 32}, {1, 130, 1, 128, 128, 64}};
  uint64_t seed = 900;
  for (const Case& c : cases)
    for (int gate = 0; gate < 3; ++gate) {
      const std::string what =
          cat("B", c.B, " T", c.T, " H", c.H, " K", c.K, " V", c.V, " chunk ", c.chunk,
              gate == 0   ? " bounded"
              : gate == 1 ? " softplus"
                          : " mixed");
      seed += 10;
      std::vector<Tensor> x;
      {
        NoGradGuard ng;
        const int64_t B = c.B, T = c.T, H = c.H, K = c.K;
        Tensor z = randn({B, T, H * K}, seed + 3, gate == 1 ? 3.0 : 1.0), g;
        if (gate == 0)
          g = ops::kda_gate_lower_bound(z, Tensor::zeros({H}), randn({H * K}, seed + 4, 0.5));
        else if (gate == 1)
          g = ops::kda_gate_softplus(z, ops::log(randu({H}, seed + 5, 1.0, 16.0)),
                                     randn({H * K}, seed + 4, 0.5));
        else
          g = ops::add(ops::mul(z, 0.1), -0.05);
        // q, k, v on the bf16 grid (the f32 reference then sees the kernel's values).
        x = {ops::l2norm(randn({B, T, H, K}, seed)).to(DType::BF16).to(DType::F32),
             ops::l2norm(randn({B, T, H, K}, seed + 1)).to(DType::BF16).to(DType::F32),
             randn({B, T, H, c.V}, seed + 2).to(DType::BF16).to(DType::F32),
             ops::reshape(g, {B, T, H, K}),
             ops::sigmoid(randn({B, T, H}, seed + 6)),
             randn({B, H, K, c.V}, seed + 7, 0.5)};
      }
      const Tensor dy = randn({c.B, c.T, c.H, c.V}, seed + 8).to(DType::BF16).to(DType::F32);
      // Output, final state, then the gradients of q, k, v, g, beta and h0, as doubles.
      auto run = [&](bool bf16, bool reference) {
        std::vector<Tensor> in;
        for (size_t i = 0; i < x.size(); ++i)
          in.push_back((bf16 && i < 3 ? x[i].to(DType::BF16) : x[i]).clone().requires_grad_());
        std::optional<ops::ReferenceMode> ref;
        if (reference) ref.emplace();
        ops::KdaOutput r = ops::kda(in[0], in[1], in[2], in[3], in[4], in[5], -1, c.chunk);
        r.o.backward(bf16 ? dy.to(DType::BF16) : dy);
        std::vector<std::vector<double>> out = {r.o.to_doubles(), r.final_state.to_doubles()};
        for (const Tensor& v : in) out.push_back(v.grad().to_doubles());
        return out;
      };
      const auto want = run(false, true), amx = run(true, false);
      cpu::force_amx_off(true);
      const auto vec = run(true, false);
      cpu::force_amx_off(false);
      const char* names[] = {"o", "state", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
      for (int i = 0; i < 8; ++i) {
        double peak = 0, err_amx = 0, err_vec = 0;
        for (size_t j = 0; j < want[i].size(); ++j) {
          peak = std::max(peak, std::abs(want[i][j]));
          err_amx = std::max(err_amx, std::abs(amx[i][j] - want[i][j]));
          err_vec = std::max(err_vec, std::abs(vec[i][j] - want[i][j]));
          ASSERT_TRUE(std::isfinite(amx[i][j])) << what << " " << names[i];
        }
        // Measured: at most 5.5e-3 of the peak (the f32-product path 3.4e-3, its bf16 output and
        // gradient rounding).
        EXPECT_LE(err_amx, 1.5e-2 * peak)
            << what << " " << names[i] << " (f32 products: " << err_vec << ", peak " << peak << ")";
      }
      // The tile path ran: the final state (f32, so no output rounding) differs from the
      // f32-product path's (which agrees with the reference to ~1e-7 of the peak).
      EXPECT_NE(amx[1], vec[1]) << what;
    }
}

}  // namespace
}  // namespace myriad::testing
