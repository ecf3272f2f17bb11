#include <gtest/gtest.h>

#include "core/autograd.h"
#include "core/random.h"
#include "ops/ops.h"

using namespace myriad;

TEST(Tensor, FactoriesAndViews) {
  Tensor t = Tensor::from_doubles(std::vector<double>{1, 2, 3, 4, 5, 6}, {2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_TRUE(t.is_contiguous());
  Tensor tt = ops::transpose(t, 0, 1);
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.contiguous().to_doubles(), (std::vector<double>{1, 4, 2, 5, 3, 6}));
}

TEST(Tensor, SumBackward) {
  Tensor x = Tensor::from_doubles(std::vector<double>{1, 2, 3, 4}, {2, 2});
  x.requires_grad_();
  Tensor y = ops::sum(ops::mul(x, x));
  y.backward();
  EXPECT_EQ(x.grad().to_doubles(), (std::vector<double>{2, 4, 6, 8}));
}
