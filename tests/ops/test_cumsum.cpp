#include "tests/ops/op_test.h"

namespace myriad::testing {
namespace {

class Cumsum : public OpTest {};
MYRIAD_OP_TEST_SUITE(Cumsum);

TEST_P(Cumsum, MatchesReference) {
  struct Case {
    Shape x;
    int64_t dim;
  };
  // Length 1, odd sizes, every position of dim (inner == 1 rows and column blocks), large.
  const Case cases[] = {{{1}, 0},         {{7}, 0},           {{3, 5}, 0},    {{3, 5}, 1},
                        {{3, 5}, -1},     {{2, 3, 4}, 1},     {{1, 9, 1}, 1}, {{1000, 333}, 0},
                        {{17, 10001}, 1}, {{4, 300, 600}, 1}, {{100003}, 0}};
  uint64_t seed = 1;
  for (const Case& c : cases) {
    Tensor x = randn(c.x, seed++).requires_grad_();
    expect_matches_reference_all(
        "cumsum " + shape_str(c.x) + " dim " + std::to_string(c.dim),
        [dim = c.dim](const std::vector<Tensor>& v) { return ops::cumsum(v[0], dim); }, {x},
        backend());
  }
}

TEST_P(Cumsum, OnesCountUpExactly) {
  Device dev = device_of(backend());
  Tensor y = ops::cumsum(Tensor::ones({3, 1000}, DType::F32, dev), 1);
  std::vector<double> v = y.to_doubles();
  for (int64_t r = 0; r < 3; ++r)
    for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(v[r * 1000 + i], i + 1);
  // The backward of a scan is the reverse scan: d sum(cumsum(x)) / dx_i = n - i.
  Tensor x = Tensor::zeros({5, 2}, DType::F32, dev).requires_grad_();
  ops::cumsum(x, 0).backward(Tensor::ones({5, 2}, DType::F32, dev));
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{5, 5, 4, 4, 3, 3, 2, 2, 1, 1}));
}

TEST_P(Cumsum, NonContiguousInput) {
  Tensor x = randn({6, 9}, 3).requires_grad_();
  expect_matches_reference_all(
      "cumsum(x^T)",
      [](const std::vector<Tensor>& v) { return ops::cumsum(ops::transpose(v[0], 0, 1), 1); }, {x},
      backend());
}

TEST(CumsumGrad, Gradcheck) {
  Tensor x = randn({3, 4, 2}, 5).requires_grad_();
  for (int64_t dim : {0, 1, 2})
    expect_gradcheck("cumsum dim " + std::to_string(dim),
                     [dim](const std::vector<Tensor>& v) { return ops::cumsum(v[0], dim); }, {x});
}

TEST(CumsumErrors, BadInput) {
  Tensor x = randn({2, 5}, 1);
  expect_error([&] { ops::cumsum(x, 2); }, {"cumsum", "dimension 2", "rank 2"});
  expect_error(
      [&] {
        ops::cumsum(Tensor::from_ints(std::vector<int64_t>{1, 2}, {2}), 0);
      },
      {"cumsum", "floating"});
}

}  // namespace
}  // namespace myriad::testing
