#include <cmath>
#include <limits>

#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class TopK : public OpTest {};
MYRIAD_OP_TEST_SUITE(TopK);

struct Case {
  Shape x;
  int64_t k;
};
// Length 1, k == n, k == 0, small k (the insertion path), large k (the selection path), a long row.
const Case kCases[] = {{{1}, 1},         {{7}, 3},          {{3, 17}, 5},
                       {{4, 100}, 100},  {{2, 3, 50}, 0},   {{512, 384}, 8},
                       {{64, 5000}, 40}, {{33, 1001}, 700}, {{1, 100003}, 1000}};

// Values on a coarse grid, so rows hold many ties (also after rounding to bf16).
Tensor with_ties(const Shape& s, uint64_t seed) {
  std::vector<double> v = randn(s, seed).to_doubles();
  for (double& e : v) e = std::round(e * 2) / 2;
  return Tensor::from_doubles(v, s);
}

TEST_P(TopK, ValuesAndGradientsMatchReference) {
  uint64_t seed = 1;
  for (const Case& c : kCases)
    for (bool ties : {false, true}) {
      Tensor x = (ties ? with_ties(c.x, seed++) : randn(c.x, seed++)).requires_grad_();
      expect_matches_reference_all(
          "topk " + shape_str(c.x) + " k " + std::to_string(c.k) + (ties ? " ties" : ""),
          [k = c.k](const std::vector<Tensor>& v) { return ops::topk(v[0], k).values; }, {x},
          backend());
    }
}

// Indices agree exactly with the reference, are in descending order of value, and tied values
// appear in ascending order of index.
TEST_P(TopK, IndicesMatchReferenceAndOrderTies) {
  Device dev = device_of(backend());
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (DType t : {DType::F32, DType::BF16}) {
      Tensor x = with_ties(c.x, seed++).to(t);
      ops::TopK got = ops::topk(x.to(dev), c.k);
      ops::TopK want;
      {
        ops::ReferenceMode ref;
        want = ops::topk(x.to(DType::F32), c.k);
      }
      SCOPED_TRACE(shape_str(c.x) + " k " + std::to_string(c.k) + " " + std::string(dtype_name(t)));
      ASSERT_EQ(got.indices.dtype(), DType::I64);
      std::vector<int64_t> gi = got.indices.to_ints();
      ASSERT_EQ(gi, want.indices.to_ints());
      std::vector<double> gv = got.values.to_doubles(), xv = x.to_doubles();
      const int64_t n = c.x.back();
      for (size_t e = 0; e < gi.size(); ++e) {
        int64_t row = e / c.k;
        ASSERT_EQ(gv[e], xv[row * n + gi[e]]);
        if (e % c.k == 0) continue;
        ASSERT_TRUE(gv[e - 1] > gv[e] || (gv[e - 1] == gv[e] && gi[e - 1] < gi[e]));
      }
    }
}

TEST_P(TopK, TiesAndNaN) {
  Device dev = device_of(backend());
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor x = Tensor::from_doubles(std::vector<double>{1, 3, 3, 2, 3, 1}, {6}, t, dev);
    ops::TopK r = ops::topk(x, 4);
    EXPECT_EQ(r.values.to_doubles(), (std::vector<double>{3, 3, 3, 2}));
    EXPECT_EQ(r.indices.to_ints(), (std::vector<int64_t>{1, 2, 4, 3}));
    const double nan = std::numeric_limits<double>::quiet_NaN();
    Tensor y = Tensor::from_doubles(std::vector<double>{1, nan, 3, nan}, {4}, t, dev);
    ops::TopK s = ops::topk(y, 3);
    EXPECT_EQ(s.indices.to_ints(), (std::vector<int64_t>{1, 3, 2}));
    EXPECT_EQ(s.values.to_doubles()[2], 3.0);
  }
}

TEST(TopKGrad, Gradcheck) {
  Tensor x = randn({3, 7}, 5).requires_grad_();
  for (int64_t k : {1, 3, 7})
    expect_gradcheck("topk k " + std::to_string(k),
                     [k](const std::vector<Tensor>& v) { return ops::topk(v[0], k).values; }, {x});
}

TEST(TopKErrors, BadK) {
  Tensor x = randn({2, 5}, 1);
  expect_error([&] { ops::topk(x, 6); }, {"topk", "k = 6", "(5)", "[2, 5]"});
  expect_error([&] { ops::topk(x, -1); }, {"topk", "k = -1"});
  expect_error([&] { ops::topk(Tensor::full({}, 1.0), 1); }, {"topk", "at least 1 dimension"});
  expect_error(
      [&] {
        ops::topk(Tensor::from_ints(std::vector<int64_t>{1, 2}, {2}), 1);
      },
      {"topk", "floating"});
}

}  // namespace
}  // namespace myriad::testing
