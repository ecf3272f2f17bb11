#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "core/error.h"
#include "train/schedule.h"

using myriad::train::lr_at;
using myriad::train::Schedule;

TEST(Schedule, WarmupIsLinearFromZero) {
  for (const char* kind : {"wsd", "cosine", "constant"}) {
    Schedule s{kind, 1e-3, 0.1, 10, 100};
    EXPECT_DOUBLE_EQ(lr_at(s, 0), 0.0) << kind;
    EXPECT_DOUBLE_EQ(lr_at(s, 3), 3e-4) << kind;
    EXPECT_DOUBLE_EQ(lr_at(s, 9), 9e-4) << kind;
    EXPECT_DOUBLE_EQ(lr_at(s, 10), 1e-3) << kind;  // end of warm-up: the peak
  }
}

TEST(Schedule, CosineEndsAtMin) {
  Schedule s{"cosine", 2.0, 0.1, 10, 110};
  EXPECT_DOUBLE_EQ(lr_at(s, 10), 2.0);
  EXPECT_NEAR(lr_at(s, 60), 0.2 + 0.5 * 1.8, 1e-12);  // half way: the mean of peak and min
  const double f = 25.0 / 100.0;
  EXPECT_NEAR(lr_at(s, 35), 0.2 + 0.9 * (1 + std::cos(std::numbers::pi * f)), 1e-12);
  EXPECT_NEAR(lr_at(s, 110), 0.2, 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(s, 500), 0.2);
  for (int64_t t = 11; t <= 110; ++t) EXPECT_LE(lr_at(s, t), lr_at(s, t - 1));
}

TEST(Schedule, WsdFlatThenOneMinusSqrtDecay) {
  Schedule s{"wsd", 1.0, 0.1, 5, 100, 20};
  for (int64_t t = 5; t <= 80; ++t) EXPECT_DOUBLE_EQ(lr_at(s, t), 1.0) << t;
  EXPECT_NEAR(lr_at(s, 85), 0.1 + 0.9 * (1 - std::sqrt(0.25)), 1e-12);
  EXPECT_NEAR(lr_at(s, 90), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-12);
  EXPECT_NEAR(lr_at(s, 99), 0.1 + 0.9 * (1 - std::sqrt(0.95)), 1e-12);
  EXPECT_DOUBLE_EQ(lr_at(s, 100), 0.1);
  EXPECT_DOUBLE_EQ(lr_at(s, 1000), 0.1);
  s.decay_shape = "linear";
  EXPECT_NEAR(lr_at(s, 85), 0.1 + 0.9 * 0.75, 1e-12);
  EXPECT_NEAR(lr_at(s, 90), 0.55, 1e-12);
  s.decay_steps = 0;  // default D = total / 10
  EXPECT_DOUBLE_EQ(lr_at(s, 90), 1.0);
  EXPECT_NEAR(lr_at(s, 95), 0.55, 1e-12);
}

TEST(Schedule, ConstantAndErrors) {
  Schedule c{"constant", 0.5, 0.1, 0, 0};
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(c, 1000000), 0.5);
  EXPECT_THROW(lr_at(Schedule{"step", 1, 0.1, 0, 10}, 3), myriad::Error);
  EXPECT_THROW(lr_at(Schedule{"wsd", 1, 0.1, 0, 10, 2, "cubic"}, 9), myriad::Error);
  EXPECT_THROW(lr_at(Schedule{"cosine", 1, 0.1, 10, 10}, 12), myriad::Error);
  EXPECT_THROW(lr_at(Schedule{"wsd", 1, 0.1, 5, 10, 8}, 7), myriad::Error);
}
