// Optimised CPU cross-entropy rows kernel: per-row log-sum-exp (two passes with fast_exp) and, in
// place, dlogits = softmax - onehot; f32 logits, vectorised through runtime-dispatched clones and
// threaded over rows. bf16 logits (the bf16 LM head's) are widened a row at a time into an f32
// buffer, computed as f32 rows are, and their gradient rounded back in place: the bits of copying
// them to f32, running the f32 kernel and copying the gradient back, without the two passes.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/cross_entropy.h"

namespace myriad::cpu {
namespace {

// Returns the loss of one row with target t; overwrites x with softmax(x) - onehot(t) if grad.
MYRIAD_CPU_CLONES float cross_entropy_row(float* x, int64_t n, int64_t t, bool grad) {
  const float m = row_max(x, n);
  const float lse = m + std::log(row_sum_exp(x, m, n));
  const float loss = lse - x[t];
  if (grad) {
    for (int64_t i = 0; i < n; ++i) x[i] = fast_exp(x[i] - lse);
    x[t] -= 1.0f;
  }
  return loss;
}

void cross_entropy_rows_cpu(Tensor& logits, const Tensor& targets, Tensor& loss, bool grad) {
  const bool low = logits.dtype() == DType::BF16;
  MYRIAD_CHECK((logits.dtype() == DType::F32 || low) && loss.dtype() == DType::F32,
               "cross_entropy: the cpu rows kernel takes f32 or bf16 logits and f32 loss, got ",
               logits.desc(), " and ", loss.desc());
  const int64_t rows = logits.shape()[0], n = logits.shape()[1];
  // Targets as i64, checked here so that no thread can index out of the row.
  std::vector<int64_t> tg(rows);
  for (int64_t r = 0; r < rows; ++r) {
    tg[r] = targets.dtype() == DType::I64 ? targets.data<int64_t>()[r] : targets.data<int32_t>()[r];
    MYRIAD_CHECK(tg[r] == ops::kIgnoreIndex || (tg[r] >= 0 && tg[r] < n), "cross_entropy: target ",
                 tg[r], " at row ", r, " is out of range for V = ", n);
  }
  float* l = loss.data<float>();
  parallel_for(rows, row_grain(n), [&](int64_t b, int64_t e) {
    std::vector<float> buf(low ? n : 0);
    for (int64_t r = b; r < e; ++r) {
      float* row = low ? buf.data() : logits.data<float>() + r * n;
      uint16_t* row16 = low ? logits.data<uint16_t>() + r * n : nullptr;
      if (tg[r] == ops::kIgnoreIndex) {
        l[r] = 0.0f;
        if (grad && low) std::fill(row16, row16 + n, uint16_t{0});
        if (grad && !low) std::fill(row, row + n, 0.0f);
        continue;
      }
      if (low) bf16_row_to_f32(row16, row, n);
      l[r] = cross_entropy_row(row, n, tg[r], grad);
      if (low && grad) f32_row_to_bf16(row, row16, n);
    }
  });
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::cross_entropy_rows_kernels, ops::Backend::CPU, &cross_entropy_rows_cpu);

}  // namespace myriad::cpu
