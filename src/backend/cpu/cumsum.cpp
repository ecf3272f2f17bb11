// Optimised CPU cumulative sum over [outer, n, inner] in f32 (bf16 values are widened). Work
// units are (outer row, block of inner columns); a unit keeps one f32 accumulator per column and
// walks the n steps, so the inner loop runs over contiguous columns and vectorises. With
// inner == 1 each unit is a scalar scan of one row.
#include <algorithm>
#include <type_traits>
#include <vector>

#include "backend/cpu/cpu.h"
#include "ops/cumsum.h"

namespace myriad::cpu {
namespace {

MYRIAD_CPU_CLONES void step_f32(float* acc, const float* x, float* out, int64_t m) {
  for (int64_t i = 0; i < m; ++i) out[i] = acc[i] += x[i];
}
MYRIAD_CPU_CLONES void step_bf16(float* acc, const uint16_t* x, uint16_t* out, int64_t m) {
  for (int64_t i = 0; i < m; ++i) out[i] = bf16_store(acc[i] += bf16_load(x[i]));
}

// One row of n elements starting at x / out (inner == 1): a scalar scan.
template <class T>
void scan_row(const T* x, T* out, int64_t n, bool reverse) {
  const int64_t first = reverse ? n - 1 : 0, step = reverse ? -1 : 1;
  float acc = 0;
  for (int64_t s = 0, e = first; s < n; ++s, e += step) {
    if constexpr (std::is_same_v<T, float>)
      out[e] = acc += x[e];
    else
      out[e] = bf16_store(acc += bf16_load(x[e]));
  }
}

void cumsum_cpu(const Tensor& x, int64_t outer, int64_t n, int64_t inner, bool reverse,
                Tensor& out) {
  MYRIAD_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
               "cumsum: the cpu kernel supports f32 and bf16, not ", dtype_name(x.dtype()));
  const bool f32 = x.dtype() == DType::F32;
  const int64_t block = std::min<int64_t>(inner, 256);
  const int64_t nblocks = block ? (inner + block - 1) / block : 0;
  parallel_for(
      outer * nblocks, std::max<int64_t>(1, 16384 / std::max<int64_t>(n * block, 1)),
      [&](int64_t b, int64_t e) {
        std::vector<float> acc(block);
        for (int64_t u = b; u < e; ++u) {
          const int64_t o = u / nblocks, c0 = (u % nblocks) * block;
          const int64_t m = std::min(block, inner - c0);
          if (inner == 1) {  // one row: a scalar scan
            if (f32)
              scan_row(x.data<float>() + o * n, out.data<float>() + o * n, n, reverse);
            else
              scan_row(x.data<uint16_t>() + o * n, out.data<uint16_t>() + o * n, n, reverse);
            continue;
          }
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int64_t s = 0; s < n; ++s) {
            const int64_t off = (o * n + (reverse ? n - 1 - s : s)) * inner + c0;
            if (f32)
              step_f32(acc.data(), x.data<float>() + off, out.data<float>() + off, m);
            else
              step_bf16(acc.data(), x.data<uint16_t>() + off, out.data<uint16_t>() + off, m);
          }
        }
      });
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::cumsum_kernels, ops::Backend::CPU, &cumsum_cpu);
}  // namespace myriad::cpu
