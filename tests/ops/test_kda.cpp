// KDA: the chunked CPU kernel against the recurrent reference (outputs, final states and
// gradients, in f32 and bf16), segment-by-segment processing with a carried state, the decode
// step, f64 gradient checks, the gates, argument errors, and golden fixtures from fla.
#include <cmath>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>

#include "ops/kda.h"
#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

struct Inputs {
  Tensor q, k, v, g, beta, h0;
  std::vector<Tensor> list() const { return {q, k, v, g, beta, h0}; }
};

// The two gates of MODEL.md §4.2, and log-decays of both signs (not a real gate, but it sends the
// CPU kernel down its direct path, which takes no factorised shortcut).
enum class Gate { LowerBound, Softplus, Mixed };
const Gate kGates[] = {Gate::LowerBound, Gate::Softplus, Gate::Mixed};

// Random KDA inputs: q and k L2-normalised per head, g from a gate, beta in (0, 1). The softplus
// gate gets large inputs so that g reaches large negative values (down to about -100).
Inputs make_inputs(int64_t B, int64_t T, int64_t H, int64_t K, int64_t V, uint64_t seed, Gate gate,
                   bool with_h0 = true) {
  NoGradGuard ng;
  Inputs in;
  in.q = ops::l2norm(randn({B, T, H, K}, seed));
  in.k = ops::l2norm(randn({B, T, H, K}, seed + 1));
  in.v = randn({B, T, H, V}, seed + 2);
  Tensor z = randn({B, T, H * K}, seed + 3, gate == Gate::Softplus ? 3.0 : 1.0);
  Tensor dt_bias = randn({H * K}, seed + 4, 0.5);
  if (gate == Gate::LowerBound) {
    in.g = ops::kda_gate_lower_bound(z, Tensor::zeros({H}), dt_bias);
  } else if (gate == Gate::Mixed) {
    in.g = ops::add(ops::mul(z, 0.1), -0.05);
  } else {
    Tensor A_log = ops::log(randu({H}, seed + 5, 1.0, 16.0));
    in.g = ops::kda_gate_softplus(z, A_log, dt_bias);
  }
  in.g = ops::reshape(in.g, {B, T, H, K});
  in.beta = ops::sigmoid(randn({B, T, H}, seed + 6));
  if (with_h0) in.h0 = randn({B, H, K, V}, seed + 7, 0.5);
  return in;
}

Tensor packed(const ops::KdaOutput& r) {
  return ops::concat({ops::flatten(r.o), ops::flatten(r.final_state)}, 0);
}

// max |got - want| <= rel * max |want| (the relative criterion of MODEL.md §4.7).
void expect_rel_close(const std::string& what, const Tensor& got, const Tensor& want, double rel) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  std::vector<double> a = got.to_doubles(), b = want.to_doubles();
  double scale = 0, err = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    scale = std::max(scale, std::abs(b[i]));
    err = std::max(err, std::abs(a[i] - b[i]));
  }
  EXPECT_LE(err, rel * scale) << what << ": max error " << err << " for max magnitude " << scale;
  for (double x : a) ASSERT_TRUE(std::isfinite(x)) << what;
}

struct Case {
  int64_t B, T, H, K, V, chunk;
};
std::string label(const Case& c, Gate gate) {
  std::ostringstream s;
  s << "B" << c.B << " T" << c.T << " H" << c.H << " K" << c.K << " V" << c.V << " chunk "
    << c.chunk
    << (gate == Gate::Softplus ? " softplus"
        : gate == Gate::Mixed  ? " mixed"
                               : " bounded");
  return s.str();
}

bool has_kernel(ops::Backend b) {
  return ops::kda_kernels().has(b) && ops::kda_backward_kernels().has(b);
}

class Kda : public OpTest {
 protected:
  void SetUp() override {
    OpTest::SetUp();
    if (!IsSkipped() && !has_kernel(backend())) GTEST_SKIP() << "no kda kernel on this backend";
  }
  Device dev() const { return device_of(backend()); }
  // The inputs on this backend's device (as new leaves).
  Tensor fresh(const Tensor& t) const { return t.defined() ? t.to(dev()).clone() : Tensor(); }
  Inputs on_device(const Inputs& in) const {
    return {fresh(in.q), fresh(in.k), fresh(in.v), fresh(in.g), fresh(in.beta), fresh(in.h0)};
  }
};
MYRIAD_OP_TEST_SUITE(Kda);

TEST_P(Kda, ChunkedMatchesRecurrentForward) {
  // T not a multiple of the chunk, T = 1, T shorter than a chunk, exact multiples, K != V.
  const Case cases[] = {{2, 100, 3, 16, 24, 16}, {1, 100, 2, 32, 32, 64}, {2, 1, 2, 16, 16, 64},
                        {1, 37, 2, 64, 64, 64},  {1, 128, 2, 64, 64, 64}, {1, 130, 1, 64, 64, 16},
                        {2, 50, 2, 5, 7, 16}};
  uint64_t seed = 10;
  for (const Case& c : cases)
    for (Gate gate : kGates)
      for (bool h0 : {true, false}) {
        Inputs in = make_inputs(c.B, c.T, c.H, c.K, c.V, seed += 10, gate, h0);
        const std::string what = label(c, gate) + (h0 ? " h0" : "");
        ops::KdaOutput want;
        {
          ops::ReferenceMode ref;
          want = ops::kda(in.q, in.k, in.v, in.g, in.beta, in.h0, -1, c.chunk);
        }
        Inputs d = on_device(in);
        ops::KdaOutput got = ops::kda(d.q, d.k, d.v, d.g, d.beta, d.h0, -1, c.chunk);
        EXPECT_EQ(got.o.dtype(), DType::F32);
        EXPECT_EQ(got.final_state.dtype(), DType::F32);
        expect_rel_close(what + " o", got.o, want.o, 1e-5);
        expect_rel_close(what + " final state", got.final_state, want.final_state, 1e-5);
      }
}

TEST_P(Kda, GradientsMatchReference) {
  // Several chunks, a partial last chunk, padded head sizes, and a single token.
  const Case cases[] = {{2, 9, 2, 3, 4, 4},    {1, 70, 2, 16, 16, 16}, {1, 45, 1, 64, 64, 64},
                        {2, 33, 2, 8, 20, 16}, {2, 50, 2, 24, 8, 32},  {1, 1, 2, 16, 16, 64}};
  uint64_t seed = 500;
  for (const Case& c : cases)
    for (Gate gate : kGates) {
      Inputs in = make_inputs(c.B, c.T, c.H, c.K, c.V, seed += 10, gate);
      std::vector<Tensor> xs = in.list();
      for (Tensor& x : xs) x.requires_grad_();
      const std::string what = label(c, gate);
      const int64_t chunk = c.chunk;
      expect_matches_reference(
          what + " (o and state)",
          [chunk](const std::vector<Tensor>& x) {
            return packed(ops::kda(x[0], x[1], x[2], x[3], x[4], x[5], -1, chunk));
          },
          xs, backend());
      // bf16: o is bf16 and the state f32, so each output is checked on its own.
      expect_matches_reference(
          what + " (o)",
          [chunk](const std::vector<Tensor>& x) {
            return ops::kda(x[0], x[1], x[2], x[3], x[4], x[5], -1, chunk).o;
          },
          xs, backend(), DType::BF16, bf16_tolerance());
      expect_matches_reference(
          what + " (state)",
          [chunk](const std::vector<Tensor>& x) {
            return ops::kda(x[0], x[1], x[2], x[3], x[4], x[5], -1, chunk).final_state;
          },
          xs, backend(), DType::BF16, bf16_tolerance());
    }
}

TEST_P(Kda, Bf16InputsGiveBf16Output) {
  Inputs in = make_inputs(1, 20, 2, 16, 16, 3, Gate::LowerBound);
  Inputs d = on_device(in);
  ops::KdaOutput r = ops::kda(d.q.to(DType::BF16), d.k.to(DType::BF16), d.v.to(DType::BF16), d.g,
                              d.beta, d.h0, -1, 16);
  EXPECT_EQ(r.o.dtype(), DType::BF16);
  EXPECT_EQ(r.final_state.dtype(), DType::F32);
  ops::KdaOutput f = ops::kda(d.q, d.k, d.v, d.g, d.beta, d.h0, -1, 16);
  expect_rel_close("bf16 o", r.o.to(DType::F32), f.o, 3e-2);
  expect_rel_close("bf16 state", r.final_state, f.final_state, 3e-2);
}

// Segments [0, 40), [40, 103), [103, 150) with the carried state equal one pass: outputs, the
// final state, and the gradients of every input (the later segments' gradients reach the
// earlier ones only through the carried state).
TEST_P(Kda, SegmentsWithCarriedStateEqualOnePass) {
  for (Gate gate : {Gate::LowerBound, Gate::Softplus}) {
    Inputs base = make_inputs(2, 150, 2, 16, 16, 77, gate);
    Tensor wo = randn({2, 150, 2, 16}, 90).to(dev()), ws = randn({2, 2, 16, 16}, 91).to(dev());
    auto run = [&](bool segmented, std::vector<Tensor>& grads) {
      Inputs in = on_device(base);
      std::vector<Tensor> xs = in.list();
      for (Tensor& x : xs) x.requires_grad_();
      ops::KdaOutput r;
      if (!segmented) {
        r = ops::kda(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], -1, 32);
      } else {
        Tensor state = xs[5];
        std::vector<Tensor> os;
        const int64_t cuts[] = {0, 40, 103, 150};
        for (int i = 0; i < 3; ++i) {
          auto seg = [&](const Tensor& t) { return ops::slice(t, 1, cuts[i], cuts[i + 1]); };
          ops::KdaOutput s =
              ops::kda(seg(xs[0]), seg(xs[1]), seg(xs[2]), seg(xs[3]), seg(xs[4]), state, -1, 32);
          os.push_back(s.o);
          state = s.final_state;
        }
        r.o = ops::concat(os, 1);
        r.final_state = state;
      }
      Tensor loss = ops::add(ops::sum(ops::mul(r.o, wo)), ops::sum(ops::mul(r.final_state, ws)));
      loss.backward();
      for (Tensor& x : xs) grads.push_back(x.grad());
      return r;
    };
    std::vector<Tensor> g1, g2;
    ops::KdaOutput one = run(false, g1), seg = run(true, g2);
    expect_rel_close("segmented o", seg.o, one.o, 1e-5);
    expect_rel_close("segmented state", seg.final_state, one.final_state, 1e-5);
    const char* names[] = {"q", "k", "v", "g", "beta", "h0"};
    for (int i = 0; i < 6; ++i)
      expect_rel_close(std::string("segmented grad of ") + names[i], g2[i], g1[i], 1e-5);
  }
}

// Outputs of 4 MiB and more (o, the saved states, dq, dk, dv, dg here: B 1, T 4096, H 4,
// K = V = 64) take the CPU kernel's streaming stores; one head's outputs are 1 MiB and take the
// ordinary ones. The heads are independent, so each head of the whole run must equal a run on
// that head alone, bit for bit: the output, the final state and every gradient.
TEST_P(Kda, LargeOutputsEqualPerHeadRuns) {
  const int64_t B = 1, T = 4096, H = 4, D = 64;
  Inputs base = make_inputs(B, T, H, D, D, 41, Gate::LowerBound);
  const Tensor wo = randn({B, T, H, D}, 42).to(dev()), ws = randn({B, H, D, D}, 43).to(dev());
  // o, final state, then the gradients of q, k, v, g, beta and h0, as doubles.
  auto run = [&](const Inputs& in, const Tensor& w_o, const Tensor& w_s) {
    std::vector<Tensor> xs = on_device(in).list();
    for (Tensor& x : xs) x.requires_grad_();
    ops::KdaOutput r = ops::kda(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], -1, 64);
    ops::add(ops::sum(ops::mul(r.o, w_o)), ops::sum(ops::mul(r.final_state, w_s))).backward();
    std::vector<Tensor> out = {r.o, r.final_state};
    for (Tensor& x : xs) out.push_back(x.grad());
    return out;
  };
  const std::vector<Tensor> all = run(base, wo, ws);
  const char* names[] = {"o", "state", "dq", "dk", "dv", "dg", "dbeta", "dh0"};
  for (int64_t h = 0; h < H; ++h) {
    // The head's slice of a [B, T, H, ...] tensor (dim 2) or of a [B, H, ...] one (dim 1).
    auto head = [h](const Tensor& t, int64_t dim) { return ops::slice(t, dim, h, h + 1); };
    const Inputs one{head(base.q, 2), head(base.k, 2),    head(base.v, 2),
                     head(base.g, 2), head(base.beta, 2), head(base.h0, 1)};
    const std::vector<Tensor> got = run(one, head(wo, 2), head(ws, 1));
    for (int i = 0; i < 8; ++i) {
      const int64_t dim = i == 1 || i == 7 ? 1 : 2;  // final state and dh0 are [B, H, K, V]
      EXPECT_EQ(got[i].to_doubles(), head(all[i], dim).to_doubles())
          << names[i] << " of head " << h;
    }
  }
}

TEST_P(Kda, RepeatedStepsEqualOnePass) {
  for (bool reference : {false, true}) {
    std::optional<ops::ReferenceMode> ref;
    if (reference) ref.emplace();
    Inputs in = on_device(make_inputs(2, 23, 3, 16, 12, 31, Gate::Softplus));
    ops::KdaOutput all = ops::kda(in.q, in.k, in.v, in.g, in.beta, in.h0, -1, 8);
    Tensor state = in.h0;
    std::vector<Tensor> os;
    for (int64_t t = 0; t < 23; ++t) {
      auto tok = [t](const Tensor& x) { return ops::slice(x, 1, t, t + 1); };
      ops::KdaOutput s =
          ops::kda_step(tok(in.q), tok(in.k), tok(in.v), tok(in.g), tok(in.beta), state);
      ASSERT_EQ(s.o.shape(), Shape({2, 1, 3, 12}));
      os.push_back(s.o);
      state = s.final_state;
    }
    const std::string what = reference ? "reference steps" : "steps";
    expect_rel_close(what + " o", ops::concat(os, 1), all.o, 1e-5);
    expect_rel_close(what + " state", state, all.final_state, 1e-5);
  }
  // From a zero state, and equal to kda() on T = 1.
  Inputs one = on_device(make_inputs(1, 1, 2, 8, 8, 32, Gate::LowerBound, false));
  ops::KdaOutput a = ops::kda_step(one.q, one.k, one.v, one.g, one.beta);
  ops::KdaOutput b = ops::kda(one.q, one.k, one.v, one.g, one.beta);
  expect_rel_close("zero-state step o", a.o, b.o, 1e-6);
  expect_rel_close("zero-state step state", a.final_state, b.final_state, 1e-6);
}

// The recurrence itself, on a hand-checkable case: K = V = 1, q = k = 1.
TEST_P(Kda, ScalarRecurrenceByHand) {
  const std::vector<double> gv = {-0.5, -1.0, 0.0}, bv = {0.5, 1.0, 0.25}, vv = {2.0, -1.0, 3.0};
  Tensor q = Tensor::ones({1, 3, 1, 1}, DType::F32, dev());
  Tensor g = Tensor::from_doubles(gv, {1, 3, 1, 1}).to(dev());
  Tensor beta = Tensor::from_doubles(bv, {1, 3, 1}).to(dev());
  Tensor v = Tensor::from_doubles(vv, {1, 3, 1, 1}).to(dev());
  Tensor h0 = Tensor::full({1, 1, 1, 1}, 0.7, DType::F32, dev());
  ops::KdaOutput r = ops::kda(q, q, v, g, beta, h0, 1.0, 2);
  double s = 0.7;
  std::vector<double> want;
  for (int t = 0; t < 3; ++t) {
    s *= std::exp(gv[t]);
    s += bv[t] * (vv[t] - s);
    want.push_back(s);
  }
  std::vector<double> got = r.o.to_doubles();
  for (int t = 0; t < 3; ++t) EXPECT_NEAR(got[t], want[t], 1e-6) << "t = " << t;
  EXPECT_NEAR(r.final_state.item(), s, 1e-6);
}

// An empty sequence returns the initial state, and its gradient passes straight through.
TEST_P(Kda, EmptySequenceKeepsTheState) {
  Inputs in = on_device(make_inputs(2, 0, 2, 4, 3, 5, Gate::LowerBound));
  in.h0.requires_grad_();
  ops::KdaOutput r = ops::kda(in.q, in.k, in.v, in.g, in.beta, in.h0);
  EXPECT_EQ(r.o.shape(), Shape({2, 0, 2, 3}));
  EXPECT_EQ(r.final_state.to_doubles(), in.h0.to_doubles());
  ops::sum(r.final_state).backward();
  for (double v : in.h0.grad().to_doubles()) EXPECT_EQ(v, 1.0);
}

// The CPU kernel's backward takes the solve rows U its forward keeps (ops::KdaSaved::u); after a
// forward that kept only the states (the reference kernel, in a ReferenceMode scope around the
// forward alone) it repeats R = V - Kg S and the solve, and takes dβ from R. Both ways must give
// the same gradients, up to the rounding of the saved states.
TEST(KdaSavedRows, BackwardWithoutThemRepeatsTheSolve) {
  uint64_t seed = 900;
  for (Gate gate : kGates) {
    const Inputs in = make_inputs(2, 70, 2, 16, 16, seed += 10, gate);
    std::vector<std::vector<double>> grads[2];
    for (int repeat = 0; repeat < 2; ++repeat) {
      std::vector<Tensor> xs = in.list();
      for (Tensor& x : xs) x = x.clone().requires_grad_();
      ops::KdaOutput r;
      {
        std::optional<ops::ReferenceMode> ref;
        if (repeat) ref.emplace();
        r = ops::kda(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], -1, 16);
      }
      ops::sum(ops::mul(r.o, randn(r.o.shape(), seed + 1))).backward();
      for (const Tensor& x : xs) {
        ASSERT_TRUE(x.grad().defined());
        grads[repeat].push_back(x.grad().to_doubles());
      }
    }
    for (size_t i = 0; i < grads[0].size(); ++i) {
      double scale = 0, err = 0;
      for (size_t j = 0; j < grads[0][i].size(); ++j) {
        scale = std::max(scale, std::abs(grads[0][i][j]));
        err = std::max(err, std::abs(grads[1][i][j] - grads[0][i][j]));
      }
      EXPECT_LE(err, 1e-5 * scale) << "grad of input " << i << ", gate " << static_cast<int>(gate);
    }
  }
}

TEST(KdaGrad, Gradcheck) {
  struct Case {
    int64_t B, T, K, V;
  };
  // Chunk 4 over T = 5..9 crosses one to three chunk boundaries.
  const Case cases[] = {{1, 5, 3, 3}, {2, 9, 4, 3}, {1, 8, 3, 4}, {2, 7, 4, 4}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    const int64_t H = 2;
    Tensor q = randn({c.B, c.T, H, c.K}, seed++, 0.5).requires_grad_();
    Tensor k = randn({c.B, c.T, H, c.K}, seed++, 0.5).requires_grad_();
    Tensor v = randn({c.B, c.T, H, c.V}, seed++).requires_grad_();
    Tensor g = randu({c.B, c.T, H, c.K}, seed++, -1.5, -0.05).requires_grad_();
    Tensor beta = randu({c.B, c.T, H}, seed++, 0.1, 0.9).requires_grad_();
    Tensor h0 = randn({c.B, H, c.K, c.V}, seed++, 0.5).requires_grad_();
    expect_gradcheck("kda T" + std::to_string(c.T),
                     [](const std::vector<Tensor>& x) {
                       return packed(ops::kda(x[0], x[1], x[2], x[3], x[4], x[5], 0.8, 4));
                     },
                     {q, k, v, g, beta, h0});
  }
}

TEST(KdaGates, MatchFormulas) {
  const int64_t H = 2, K = 3;
  Tensor z = randn({2, H * K}, 1, 2.0), dt = randn({H * K}, 2, 0.5);
  Tensor A_log = randn({1, 1, H, 1}, 3, 0.5);
  std::vector<double> zv = z.to_doubles(), dv = dt.to_doubles(), av = A_log.to_doubles();
  std::vector<double> sp = ops::kda_gate_softplus(z, A_log, dt).to_doubles();
  std::vector<double> lb = ops::kda_gate_lower_bound(z, A_log, dt, -5.0).to_doubles();
  std::vector<double> lb0 = ops::kda_gate_lower_bound(z, Tensor(), dt, -4.0).to_doubles();
  for (int64_t i = 0; i < 2 * H * K; ++i) {
    const int64_t c = i % (H * K), h = c / K;
    const double x = zv[i] + dv[c];
    const double softplus = x > 20 ? x : std::log1p(std::exp(x));
    EXPECT_NEAR(sp[i], -std::exp(av[h]) * softplus, 1e-5) << i;
    EXPECT_NEAR(lb[i], -5.0 / (1.0 + std::exp(-std::exp(av[h]) * x)), 1e-5) << i;
    EXPECT_NEAR(lb0[i], -4.0 / (1.0 + std::exp(-x)), 1e-5) << i;
  }
  // Big inputs stay finite and inside the bounds.
  Tensor big = ops::mul(z, 100.0);
  for (double x : ops::kda_gate_softplus(big, A_log, dt).to_doubles()) {
    EXPECT_TRUE(std::isfinite(x));
    EXPECT_LE(x, 0.0);
  }
  for (double x : ops::kda_gate_lower_bound(big, A_log, dt).to_doubles()) {
    EXPECT_GE(x, -5.0);
    EXPECT_LE(x, 0.0);
  }
  // bf16 z gives an f32 gate.
  EXPECT_EQ(ops::kda_gate_softplus(z.to(DType::BF16), A_log, dt).dtype(), DType::F32);
}

// The fused gate kernels (the composition where a backend has none) against the reference:
// outputs and the gradients of z, A_log and dt_bias, f32 and bf16 z, with row counts around the
// backward's 32-row blocks, one head and four, no bias, and the lower bound without A_log.
class KdaGate : public OpTest {};
MYRIAD_OP_TEST_SUITE(KdaGate);

TEST_P(KdaGate, MatchesReference) {
  for (int64_t rows : {1, 31, 70})
    for (int64_t H : {1, 4}) {
      const int64_t P = 3 * H;
      Tensor z = randn({rows, P}, 40 + rows, 3.0).requires_grad_();
      Tensor A_log = randn({H}, 41, 0.5).requires_grad_(),
             dt = randn({P}, 42, 0.5).requires_grad_();
      const std::string shape = cat(" rows ", rows, " H ", H);
      expect_matches_reference_all(
          "kda_gate_softplus" + shape,
          [](const std::vector<Tensor>& x) { return ops::kda_gate_softplus(x[0], x[1], x[2]); },
          {z, A_log, dt}, backend());
      expect_matches_reference_all(
          "kda_gate_softplus, no bias" + shape,
          [](const std::vector<Tensor>& x) { return ops::kda_gate_softplus(x[0], x[1]); },
          {z, A_log}, backend());
      expect_matches_reference_all(
          "kda_gate_lower_bound" + shape,
          [](const std::vector<Tensor>& x) {
            return ops::kda_gate_lower_bound(x[0], x[1], x[2], -5.0);
          },
          {z, A_log, dt}, backend());
      expect_matches_reference_all(
          "kda_gate_lower_bound, no A_log" + shape,
          [](const std::vector<Tensor>& x) {
            return ops::kda_gate_lower_bound(x[0], Tensor(), x[1], -4.0);
          },
          {z, dt}, backend());
    }
}

TEST(KdaGates, L2Norm) {
  Tensor x = randn({3, 5}, 4);
  std::vector<double> xv = x.to_doubles(), y = ops::l2norm(x).to_doubles();
  for (int r = 0; r < 3; ++r) {
    double ss = 0;
    for (int i = 0; i < 5; ++i) ss += xv[r * 5 + i] * xv[r * 5 + i];
    for (int i = 0; i < 5; ++i)
      EXPECT_NEAR(y[r * 5 + i], xv[r * 5 + i] / std::sqrt(ss + 1e-6), 1e-6);
  }
  EXPECT_EQ(ops::l2norm(x.to(DType::BF16)).dtype(), DType::BF16);
  // A zero row stays zero (eps keeps it finite).
  for (double v : ops::l2norm(Tensor::zeros({2, 4})).to_doubles()) EXPECT_EQ(v, 0.0);
}

TEST(KdaGates, Gradcheck) {
  Tensor z = randn({2, 6}, 5).requires_grad_();
  Tensor A_log = randn({2}, 6, 0.3).requires_grad_();
  Tensor dt = randn({6}, 7, 0.3).requires_grad_();
  expect_gradcheck(
      "kda_gate_softplus",
      [](const std::vector<Tensor>& x) { return ops::kda_gate_softplus(x[0], x[1], x[2]); },
      {z, A_log, dt});
  expect_gradcheck(
      "kda_gate_lower_bound",
      [](const std::vector<Tensor>& x) { return ops::kda_gate_lower_bound(x[0], x[1], x[2]); },
      {z, A_log, dt});
  expect_gradcheck("l2norm", [](const std::vector<Tensor>& x) { return ops::l2norm(x[0]); }, {z});
}

TEST(KdaErrors, BadShapesNameTheOp) {
  Inputs in = make_inputs(1, 4, 2, 3, 5, 1, Gate::LowerBound);
  expect_error(
      [&] {
        ops::kda(in.q, randn({1, 4, 2, 4}, 1), in.v, in.g, in.beta, in.h0);
      },
      {"kda", "[1, 4, 2, 3]", "[1, 4, 2, 4]"});
  expect_error(
      [&] {
        ops::kda(in.q, in.k, randn({1, 3, 2, 5}, 1), in.g, in.beta, in.h0);
      },
      {"kda", "v must be", "[1, 3, 2, 5]"});
  expect_error(
      [&] {
        ops::kda(in.q, in.k, in.v, in.g, randn({1, 4, 3}, 1), in.h0);
      },
      {"kda", "beta", "[1, 4, 3]"});
  expect_error(
      [&] {
        ops::kda(in.q, in.k, in.v, in.g, in.beta, randn({1, 2, 5, 3}, 1));
      },
      {"kda", "state", "[1, 2, 5, 3]"});
  expect_error([&] { ops::kda(in.q, in.k, in.v, in.g, in.beta, in.h0, -1, 0); },
               {"kda", "chunk_size"});
  expect_error(
      [&] {
        ops::kda(ops::reshape(in.q, {4, 2, 3}), in.k, in.v, in.g, in.beta);
      },
      {"kda", "[4, 2, 3]"});
  expect_error([&] { ops::kda(in.q, in.k.to(DType::BF16), in.v, in.g, in.beta); }, {"kda", "bf16"});
  expect_error([&] { ops::kda_step(in.q, in.k, in.v, in.g, in.beta, in.h0); },
               {"kda_step", "T = 1", "[1, 4, 2, 3]"});
  expect_error(
      [&] {
        ops::kda_gate_softplus(randn({2, 7}, 1), randn({2}, 2), randn({7}, 3));
      },
      {"kda_gate_softplus", "multiple", "[2, 7]"});
  expect_error(
      [&] {
        ops::kda_gate_lower_bound(randn({2, 6}, 1), randn({2}, 2), randn({5}, 3));
      },
      {"kda_gate_lower_bound", "dt_bias", "[5]"});
}

// ---- golden fixtures from fla (tools/reference/kda_fixtures.py) ----

// index.txt lines: "<name> <offset in floats> <dims...>"; data.bin: little-endian f32.
struct Fixture {
  std::map<std::string, Tensor> t;
  std::map<std::string, double> scalar;
  const Tensor& operator[](const std::string& n) const {
    auto it = t.find(n);
    if (it == t.end()) throw Error("fixture lacks tensor " + n);
    return it->second;
  }
};

std::string fixture_dir() {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/kda/";
}

Fixture load_fixture(const std::string& name) {
  Fixture f;
  std::ifstream idx(fixture_dir() + name + ".txt");
  std::ifstream bin(fixture_dir() + name + ".bin", std::ios::binary);
  if (!idx || !bin) throw Error("missing fixture " + fixture_dir() + name);
  std::vector<char> bytes((std::istreambuf_iterator<char>(bin)), {});
  std::string line;
  while (std::getline(idx, line)) {
    std::istringstream ls(line);
    std::string kind, key;
    ls >> kind >> key;
    if (kind == "scalar") {
      ls >> f.scalar[key];
      continue;
    }
    int64_t off = 0, d = 0;
    Shape shape;
    ls >> off;
    while (ls >> d) shape.push_back(d);
    const int64_t n = shape_numel(shape);
    if ((off + n) * 4 > static_cast<int64_t>(bytes.size())) throw Error("fixture overrun " + key);
    std::vector<float> v(n);
    std::memcpy(v.data(), bytes.data() + off * 4, n * 4);
    f.t[key] = Tensor::from_floats(v, shape);
  }
  return f;
}

TEST_P(Kda, MatchesFlaGoldenFixtures) {
  std::ifstream list(fixture_dir() + "cases.txt");
  ASSERT_TRUE(list) << "missing " << fixture_dir() << "cases.txt";
  std::string name;
  int count = 0;
  while (list >> name) {
    SCOPED_TRACE(name);
    Fixture f = load_fixture(name);
    const int64_t chunk = static_cast<int64_t>(f.scalar.at("chunk"));
    const double scale = f.scalar.at("scale");
    const bool has_h0 = f.t.count("h0") != 0;
    Tensor g = f["g"];
    if (f.t.count("z")) {  // the gate is part of the case: recompute it from z
      Tensor gz = f.scalar.at("gate") == 1.0
                      ? ops::kda_gate_lower_bound(f["z"], f["A_log"], f["dt_bias"], -5.0)
                      : ops::kda_gate_softplus(f["z"], f["A_log"], f["dt_bias"]);
      expect_rel_close("gate", ops::reshape(gz, g.shape()), g, 1e-5);
    }
    for (bool reference : {false, true}) {
      std::optional<ops::ReferenceMode> ref;
      if (reference) ref.emplace();
      std::vector<Tensor> xs = {f["q"], f["k"], f["v"], g, f["beta"]};
      xs.push_back(has_h0 ? f["h0"] : Tensor());
      for (Tensor& x : xs)
        if (x.defined()) x = fresh(x).requires_grad_();
      ops::KdaOutput r = ops::kda(xs[0], xs[1], xs[2], xs[3], xs[4], xs[5], scale, chunk);
      const std::string what = reference ? "reference " : "cpu ";
      expect_rel_close(what + "o", r.o, f["o"], 2e-5);
      expect_rel_close(what + "final state", r.final_state, f["ht"], 2e-5);
      Tensor loss = ops::add(ops::sum(ops::mul(r.o, f["w_o"].to(dev()))),
                             ops::sum(ops::mul(r.final_state, f["w_ht"].to(dev()))));
      loss.backward();
      const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dh0"};
      for (int i = 0; i < 6; ++i)
        if (xs[i].defined()) expect_rel_close(what + names[i], xs[i].grad(), f[names[i]], 5e-5);
    }
    ++count;
  }
  EXPECT_GE(count, 3);
}

}  // namespace
}  // namespace myriad::testing
