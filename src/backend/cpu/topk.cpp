// Optimised CPU top-k over the rows of [rows, n], threaded over rows. Small k keeps a sorted
// buffer of the best k while scanning the row (most elements fail the first comparison); large k
// selects with nth_element on (value, index) pairs and sorts the selected prefix. Both use
// ops::topk_before, so ties keep the lower index first whichever path runs.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu.h"
#include "ops/topk.h"

namespace myriad::cpu {
namespace {

struct Item {
  float v;
  int64_t i;
};
inline bool before(const Item& a, const Item& b) {
  return ops::topk_before(a.v, a.i, b.v, b.i);
}

// The best k of row v[0, n) into best[0, k), in order.
void select_row(const float* v, int64_t n, int64_t k, std::vector<Item>& best) {
  best.clear();
  if (k == 0) return;
  if (k <= 32 && k * 4 <= n) {
    for (int64_t i = 0; i < k; ++i) best.push_back({v[i], i});
    std::sort(best.begin(), best.end(), before);
    float worst = best.back().v;
    for (int64_t i = k; i < n; ++i) {
      if (v[i] <= worst) continue;  // ties lose to the lower index held; NaN compares false
      Item it{v[i], i};
      if (!before(it, best.back())) continue;
      best.pop_back();
      best.insert(std::upper_bound(best.begin(), best.end(), it, before), it);
      worst = best.back().v;
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) best.push_back({v[i], i});
  if (k < n) std::nth_element(best.begin(), best.begin() + k, best.end(), before);
  std::sort(best.begin(), best.begin() + k, before);
  best.resize(k);
}

void topk_cpu(const Tensor& x, int64_t k, Tensor& values, Tensor& indices) {
  MYRIAD_CHECK(x.dtype() == DType::F32 || x.dtype() == DType::BF16,
               "topk: the cpu kernel supports f32 and bf16, not ", dtype_name(x.dtype()));
  const bool f32 = x.dtype() == DType::F32;
  const int64_t n = x.shape().back(), rows = n ? x.numel() / n : 0;
  parallel_for(rows, std::max<int64_t>(1, 4096 / std::max<int64_t>(n, 1)),
               [&](int64_t b, int64_t e) {
                 std::vector<Item> best;
                 best.reserve(n);
                 std::vector<float> conv(f32 ? 0 : n);
                 for (int64_t r = b; r < e; ++r) {
                   const float* row;
                   if (f32) {
                     row = x.data<float>() + r * n;
                   } else {
                     const uint16_t* p = x.data<uint16_t>() + r * n;
                     for (int64_t i = 0; i < n; ++i) conv[i] = bf16_load(p[i]);
                     row = conv.data();
                   }
                   select_row(row, n, k, best);
                   int64_t* oi = indices.data<int64_t>() + r * k;
                   for (int64_t j = 0; j < k; ++j) oi[j] = best[j].i;
                   if (f32)  // values are copies of the picked elements (exact in bf16 too)
                     for (int64_t j = 0; j < k; ++j) values.data<float>()[r * k + j] = best[j].v;
                   else
                     for (int64_t j = 0; j < k; ++j)
                       values.data<uint16_t>()[r * k + j] = x.data<uint16_t>()[r * n + best[j].i];
                 }
               });
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::topk_kernels, ops::Backend::CPU, &topk_cpu);
}  // namespace myriad::cpu
