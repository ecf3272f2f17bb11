// Row-major iteration over N strided operands of one shape, handing the element offsets of each
// operand to a callback. Used by reference kernels and by the CPU kernels' non-contiguous paths.
#pragma once
#include <array>
#include <cstdint>

#include "core/tensor.h"

namespace myriad {

template <size_t N, class F>
void for_each_offset(const Shape& shape, const std::array<const Shape*, N>& strides, F&& f) {
  const int64_t rank = static_cast<int64_t>(shape.size());
  const int64_t n = shape_numel(shape);
  if (n == 0) return;
  std::array<int64_t, N> off{};
  if (rank == 0) {
    f(off);
    return;
  }
  std::vector<int64_t> idx(rank, 0);
  const int64_t last = shape[rank - 1];
  std::array<int64_t, N> step;
  for (size_t k = 0; k < N; ++k) step[k] = (*strides[k])[rank - 1];
  for (int64_t done = 0; done < n; done += last) {
    std::array<int64_t, N> o = off;
    for (int64_t j = 0; j < last; ++j) {
      f(o);
      for (size_t k = 0; k < N; ++k) o[k] += step[k];
    }
    // Advance the outer index (all but the last dimension).
    for (int64_t d = rank - 2; d >= 0; --d) {
      ++idx[d];
      for (size_t k = 0; k < N; ++k) off[k] += (*strides[k])[d];
      if (idx[d] < shape[d]) break;
      for (size_t k = 0; k < N; ++k) off[k] -= (*strides[k])[d] * shape[d];
      idx[d] = 0;
    }
  }
}

}  // namespace myriad
