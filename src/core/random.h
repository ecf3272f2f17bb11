// Deterministic random numbers: Philox-4x32-10, counter based, so a (seed, offset) pair names a
// stream exactly on every device and thread count. Generators advance their offset as they draw.
#pragma once
#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace myriad {

// One Philox-4x32-10 block: four 32-bit outputs for (counter, key).
std::array<uint32_t, 4> philox4x32(std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key);

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  uint64_t seed() const { return seed_; }
  uint64_t offset() const { return offset_; }  // blocks of 4 values drawn so far
  void set_state(uint64_t seed, uint64_t offset) { seed_ = seed, offset_ = offset; }

  uint32_t next_u32();
  double uniform();  // [0, 1)
  double normal();   // N(0, 1), Box-Muller

  // Tensors of i.i.d. values (drawn on the host, then moved to the device).
  Tensor uniform(const Shape& shape, double lo, double hi, DType dtype = DType::F32,
                 Device device = kCPU);
  Tensor normal(const Shape& shape, double mean, double std, DType dtype = DType::F32,
                Device device = kCPU);
  Tensor randint(const Shape& shape, int64_t lo, int64_t hi, DType dtype = DType::I64,
                 Device device = kCPU);

 private:
  uint64_t seed_;
  uint64_t offset_ = 0;
  std::array<uint32_t, 4> buf_{};
  int buf_pos_ = 4;
};

}  // namespace myriad
