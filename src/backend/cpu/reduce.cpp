// Optimised CPU reductions over [outer, r, inner]: f32 accumulators, vectorised, threaded over
// outer rows (or over inner columns when there is a single outer row).
#include <limits>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/reduce.h"

namespace myriad::cpu {
namespace {
using ops::ReduceOp;

// row_sum (16 independent partial sums) compiled for each vector target.
MYRIAD_CPU_CLONES float sum_contig(const float* x, int64_t n) {
  return row_sum(x, n);
}
MYRIAD_CPU_CLONES void add_row(float* acc, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += x[i];
}
MYRIAD_CPU_CLONES void max_row(float* acc, int64_t* arg, const float* x, int64_t k, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    bool take = x[i] > acc[i] || (x[i] != x[i] && acc[i] == acc[i]);
    acc[i] = take ? x[i] : acc[i];
    arg[i] = take ? k : arg[i];
  }
}

void reduce_cpu(ReduceOp op, const Tensor& x, int64_t outer, int64_t r, int64_t inner, Tensor& out,
                Tensor* idx) {
  MYRIAD_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
               "reduce: the cpu kernel supports f32 and bf16, not ", dtype_name(x.dtype()));
  const bool f32 = x.dtype() == DType::F32;
  // Column blocks so that a single outer row still uses every thread.
  const int64_t block = std::min<int64_t>(inner, 1024);
  const int64_t nblocks = (inner + block - 1) / block;
  parallel_for(
      outer * nblocks, std::max<int64_t>(1, (1 << 16) / std::max<int64_t>(r * block, 1)),
      [&](int64_t b, int64_t e) {
        std::vector<float> acc(block), conv(f32 ? 0 : std::max(block, r));
        std::vector<int64_t> arg(block);
        for (int64_t w = b; w < e; ++w) {
          int64_t o = w / nblocks, c0 = (w % nblocks) * block, m = std::min(block, inner - c0);
          auto src = [&](int64_t k) -> const float* {  // row k of block (o, c0), as f32
            if (f32) return x.data<float>() + (o * r + k) * inner + c0;
            const uint16_t* p = x.data<uint16_t>() + (o * r + k) * inner + c0;
            for (int64_t i = 0; i < m; ++i) conv[i] = bf16_load(p[i]);
            return conv.data();
          };
          float* res = acc.data();
          if (op == ReduceOp::Sum && inner == 1) {
            const float* row;
            if (f32) {
              row = x.data<float>() + o * r;
            } else {
              const uint16_t* p = x.data<uint16_t>() + o * r;
              for (int64_t i = 0; i < r; ++i) conv[i] = bf16_load(p[i]);
              row = conv.data();
            }
            acc[0] = sum_contig(row, r);
          } else if (op == ReduceOp::Sum) {
            std::fill(acc.begin(), acc.begin() + m, 0.0f);
            for (int64_t k = 0; k < r; ++k) add_row(res, src(k), m);
          } else {
            std::fill(acc.begin(), acc.begin() + m, -std::numeric_limits<float>::infinity());
            std::fill(arg.begin(), arg.begin() + m, 0);
            for (int64_t k = 0; k < r; ++k) max_row(res, arg.data(), src(k), k, m);
          }
          for (int64_t i = 0; i < m; ++i) {
            int64_t at = o * inner + c0 + i;
            if (f32)
              out.data<float>()[at] = acc[i];
            else
              out.data<uint16_t>()[at] = bf16_store(acc[i]);
            if (idx) idx->data<int64_t>()[at] = arg[i];
          }
        }
      });
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::reduce_kernels, ops::Backend::CPU, &reduce_cpu);
}  // namespace myriad::cpu
