#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Conv1d : public OpTest {};
MYRIAD_OP_TEST_SUITE(Conv1d);

Tensor conv(const std::vector<Tensor>& v) {
  return ops::conv1d_causal(v[0], v[1], v.size() > 2 ? v[2] : Tensor());
}

TEST_P(Conv1d, MatchesReference) {
  struct Case {
    int64_t B, T, C, K;
  };
  // K = 1 and 4, T = 1, T < K-1, odd sizes, several time blocks, a large one.
  const Case cases[] = {{1, 1, 1, 1}, {2, 7, 5, 4},   {3, 1, 8, 4},    {2, 2, 3, 4},
                        {2, 9, 6, 1}, {2, 65, 33, 3}, {1, 100, 17, 7}, {4, 300, 257, 4}};
  uint64_t seed = 1;
  for (const Case& c : cases)
    for (bool with_state : {false, true}) {
      std::vector<Tensor> in = {randn({c.B, c.T, c.C}, seed++).requires_grad_(),
                                randn({c.C, c.K}, seed++, 0.5).requires_grad_()};
      if (with_state) in.push_back(randn({c.B, c.C, c.K - 1}, seed++).requires_grad_());
      expect_matches_reference_all("conv1d B " + std::to_string(c.B) + " T " + std::to_string(c.T) +
                                       " C " + std::to_string(c.C) + " K " + std::to_string(c.K) +
                                       (with_state ? " with state" : ""),
                                   conv, in, backend());
    }
}

// Running a sequence in segments, carrying the state, equals one pass: the outputs and the
// final state agree.
TEST_P(Conv1d, SegmentsWithCarriedStateEqualOnePass) {
  Device dev = device_of(backend());
  const int64_t B = 2, T = 11, C = 6;
  for (int64_t K : {1, 4})
    for (DType t : {DType::F32, DType::BF16})
      for (const std::vector<int64_t>& parts :
           {std::vector<int64_t>{5, 6}, {3, 1, 7}, {1, 2, 8}, {1, 1, 9}}) {
        SCOPED_TRACE("K " + std::to_string(K) + " " + std::string(dtype_name(t)) + " parts " +
                     shape_str(parts));
        Tensor x = randn({B, T, C}, 7).to(t).to(dev);
        Tensor w = randn({C, K}, 8).to(t).to(dev);
        Tensor s0 = randn({B, C, K - 1}, 9).to(t).to(dev);
        Tensor y_full = ops::conv1d_causal(x, w, s0);
        Tensor s_full = ops::conv1d_next_state(x, s0, K);
        std::vector<Tensor> ys;
        Tensor s = s0;
        int64_t at = 0;
        for (int64_t len : parts) {
          Tensor seg = ops::slice(x, 1, at, at + len);
          ys.push_back(ops::conv1d_causal(seg, w, s));
          s = ops::conv1d_next_state(seg, s, K);
          at += len;
        }
        EXPECT_EQ(ops::concat(ys, 1).to_doubles(), y_full.to_doubles());
        EXPECT_EQ(s.shape(), (Shape{B, C, K - 1}));
        EXPECT_EQ(s.to_doubles(), s_full.to_doubles());
      }
}

TEST_P(Conv1d, NextStateReachesIntoState) {
  Device dev = device_of(backend());
  // x [1, 2, 1] = {10, 11}, state [1, 1, 3] = {1, 2, 3}: the last 3 inputs are {3, 10, 11}.
  Tensor x = Tensor::from_doubles(std::vector<double>{10, 11}, {1, 2, 1}, DType::F32, dev);
  Tensor s = Tensor::from_doubles(std::vector<double>{1, 2, 3}, {1, 1, 3}, DType::F32, dev);
  EXPECT_EQ(ops::conv1d_next_state(x, s, 4).to_doubles(), (std::vector<double>{3, 10, 11}));
  EXPECT_EQ(ops::conv1d_next_state(x, {}, 4).to_doubles(), (std::vector<double>{0, 10, 11}));
  // y[t] = sum_j w[j] xpad[t + j] with w = {1, 0, 0, 0} picks the input K-1 steps back.
  Tensor w = Tensor::from_doubles(std::vector<double>{1, 0, 0, 0}, {1, 4}, DType::F32, dev);
  EXPECT_EQ(ops::conv1d_causal(x, w, s).to_doubles(), (std::vector<double>{1, 2}));
}

TEST(Conv1dGrad, Gradcheck) {
  for (int64_t K : {1, 2, 4})
    for (int64_t T : {1, 2, 5}) {
      Tensor x = randn({2, T, 3}, 10 + T).requires_grad_();
      Tensor w = randn({3, K}, 20 + K).requires_grad_();
      Tensor s = randn({2, 3, K - 1}, 30 + K).requires_grad_();
      std::string what = "conv1d K " + std::to_string(K) + " T " + std::to_string(T);
      expect_gradcheck(what, conv, {x, w});
      expect_gradcheck(what + " with state", conv, {x, w, s});
      expect_gradcheck(
          what + " next_state",
          [K](const std::vector<Tensor>& v) { return ops::conv1d_next_state(v[0], v[1], K); },
          {x, s});
    }
}

TEST(Conv1dErrors, Shapes) {
  Tensor x = randn({2, 5, 3}, 1), w = randn({3, 4}, 2);
  expect_error(
      [&] {
        ops::conv1d_causal(x, randn({4, 4}, 3));
      },
      {"conv1d_causal", "[2, 5, 3]", "[4, 4]"});
  expect_error([&] { ops::conv1d_causal(randn({5, 3}, 4), w); }, {"conv1d_causal", "[5, 3]"});
  expect_error([&] { ops::conv1d_causal(x, randn({3, 0}, 5)); }, {"conv1d_causal", "K >= 1"});
  expect_error(
      [&] {
        ops::conv1d_causal(x, w, randn({2, 3, 2}, 6));
      },
      {"conv1d_causal", "state", "[2, 3, 2]", "[2, 3, 3]"});
  expect_error([&] { ops::conv1d_causal(x, w.to(DType::BF16)); }, {"conv1d_causal", "dtype"});
  expect_error(
      [&] {
        ops::conv1d_next_state(x, randn({2, 3, 1}, 7), 4);
      },
      {"conv1d_next_state", "[2, 3, 1]"});
  expect_error([&] { ops::conv1d_next_state(x, {}, 0); }, {"conv1d_next_state", "0"});
}

}  // namespace
}  // namespace myriad::testing
