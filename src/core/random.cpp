#include "core/random.h"

#include <cmath>
#include <numbers>
#include <vector>

namespace myriad {

std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> c, std::array<uint32_t, 2> k) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int r = 0; r < 10; ++r) {
    uint64_t p0 = static_cast<uint64_t>(kM0) * c[0];
    uint64_t p1 = static_cast<uint64_t>(kM1) * c[2];
    c = {static_cast<uint32_t>(p1 >> 32) ^ c[1] ^ k[0], static_cast<uint32_t>(p1),
         static_cast<uint32_t>(p0 >> 32) ^ c[3] ^ k[1], static_cast<uint32_t>(p0)};
    k[0] += kW0;
    k[1] += kW1;
  }
  return c;
}

uint32_t Generator::next_u32() {
  if (buf_pos_ == 4) {
    buf_ = philox4x32({static_cast<uint32_t>(offset_), static_cast<uint32_t>(offset_ >> 32), 0, 0},
                      {static_cast<uint32_t>(seed_), static_cast<uint32_t>(seed_ >> 32)});
    ++offset_;
    buf_pos_ = 0;
  }
  return buf_[buf_pos_++];
}

double Generator::uniform() {
  uint64_t hi = next_u32(), lo = next_u32();
  return static_cast<double>(((hi << 32) | lo) >> 11) * 0x1.0p-53;
}

double Generator::normal() {
  double u1 = uniform(), u2 = uniform();
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

Tensor Generator::uniform(const Shape& shape, double lo, double hi, DType dtype, Device device) {
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = lo + (hi - lo) * uniform();
  return Tensor::from_doubles(v, shape, dtype, device);
}
Tensor Generator::normal(const Shape& shape, double mean, double std, DType dtype, Device device) {
  std::vector<double> v(shape_numel(shape));
  for (double& x : v) x = mean + std * normal();
  return Tensor::from_doubles(v, shape, dtype, device);
}
Tensor Generator::randint(const Shape& shape, int64_t lo, int64_t hi, DType dtype, Device device) {
  MYRIAD_CHECK(hi > lo, "randint: empty range [", lo, ", ", hi, ")");
  std::vector<int64_t> v(shape_numel(shape));
  uint64_t span = static_cast<uint64_t>(hi - lo);
  for (auto& x : v) {
    uint64_t r = (static_cast<uint64_t>(next_u32()) << 32) | next_u32();
    x = lo + static_cast<int64_t>(r % span);
  }
  return Tensor::from_ints(v, shape, dtype, device);
}

}  // namespace myriad
