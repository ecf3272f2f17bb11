// Helpers shared by the model tests.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/random.h"
#include "model/decoder.h"

namespace myriad::model {

inline std::string fixture_dir(const std::string& name) {
  return std::string(MYRIAD_SOURCE_DIR) + "/tests/fixtures/models/" + name;
}

inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  auto x = a.to_doubles(), y = b.to_doubles();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::abs(x[i] - y[i]));
  return m;
}

// A random model whose zero-initialised tensors (AttnRes projections, A_log, the selection bias)
// are made random too, so no path is trivially flat, with O(1) activations; ones and constants
// keep their init.
inline Decoder random_model(const ModelConfig& c, DType dtype, uint64_t seed) {
  Decoder m = Decoder::random(c, seed, dtype);
  Generator gen(seed + 1);
  for (const auto& s : m.weights().specs())
    if (s.init == Init::Zeros || s.init == Init::Normal)
      m.weights().set(s.name, gen.normal(s.shape, 0.0, s.init == Init::Zeros ? 0.5 : 0.3, dtype));
  return m;
}

}  // namespace myriad::model
