// Optimised CPU AttnRes: per token, one pass over the sources for the scores and one to mix them
// (f32 or bf16 in, f32 math), threaded over tokens. The backward sums the pseudo-query gradient
// in per-chunk partials reduced afterwards, so no two threads write one accumulator.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu.h"
#include "backend/cpu/rows.h"
#include "ops/attn_res.h"

namespace myriad::cpu {
namespace {

// Scores of one token: r_i = 1/sqrt(mean(v_i²) + eps), a_i = r_i (v_i·c), p = softmax(a); with gy,
// also dp_i = gy·v_i.
MYRIAD_CPU_CLONES void row_scores(const float* const* v, int64_t m, const float* c, float eps,
                                  int64_t d, const float* gy, float* a, float* r, float* p,
                                  float* dp) {
  float amax = -__builtin_inff();
  for (int64_t i = 0; i < m; ++i) {
    r[i] = 1.0f / std::sqrt(row_dot(v[i], v[i], d) / static_cast<float>(d) + eps);
    a[i] = r[i] * row_dot(v[i], c, d);
    amax = std::max(amax, a[i]);
    if (gy) dp[i] = row_dot(gy, v[i], d);
  }
  float z = 0;
  for (int64_t i = 0; i < m; ++i) z += p[i] = std::exp(a[i] - amax);
  for (int64_t i = 0; i < m; ++i) p[i] /= z;
}

// y = a·x (+ y when accumulating).
MYRIAD_CPU_CLONES void scale_add(float* y, float a, const float* x, int64_t n, bool acc) {
  if (acc)
    for (int64_t k = 0; k < n; ++k) y[k] += a * x[k];
  else
    for (int64_t k = 0; k < n; ++k) y[k] = a * x[k];
}

// gv = p gy + da (r c − a r² v / d); gc += da r v.
MYRIAD_CPU_CLONES void source_grad(const float* v, const float* gy, const float* c, float p,
                                   float da, float r, float a, int64_t d, float* gv, float* gc) {
  const float kc = da * r, kv = da * a * r * r / static_cast<float>(d);
  for (int64_t k = 0; k < d; ++k) {
    gv[k] = p * gy[k] + kc * c[k] - kv * v[k];
    gc[k] += kc * v[k];
  }
}

// c = w ⊙ gamma in f32.
std::vector<float> pseudo_query(const Tensor& w, const Tensor& gamma) {
  const int64_t d = w.numel();
  std::vector<float> c(d), b(d);
  const float* pw = RowIO(w).load(0, d, c.data());
  const float* pg = RowIO(gamma).load(0, d, b.data());
  std::vector<float> out(d);
  for (int64_t k = 0; k < d; ++k) out[k] = pw[k] * pg[k];
  return out;
}

// Per-thread buffers: f32 copies of one token's sources (bf16), two spare rows, and the
// per-source scalars.
struct Scratch {
  Scratch(int64_t m, int64_t d) : buf((m + 2) * d), v(m), a(m), r(m), p(m), dp(m) {}
  std::vector<float> buf;
  std::vector<const float*> v;
  std::vector<float> a, r, p, dp;
  // Points v[i] at row `row` of every source as f32.
  void load(const std::vector<RowIO>& io, int64_t row, int64_t d) {
    for (size_t i = 0; i < io.size(); ++i) v[i] = io[i].load(row, d, buf.data() + i * d);
  }
  float* extra(int64_t m, int64_t d, int k) { return buf.data() + (m + k) * d; }
};

void attn_res_cpu(const std::vector<Tensor>& vs, const Tensor& w, const Tensor& gamma, double eps,
                  Tensor& out) {
  check_row_dtype("attn_res", out.dtype());
  const int64_t rows = out.shape()[0], d = out.shape()[1], m = static_cast<int64_t>(vs.size());
  const std::vector<float> c = pseudo_query(w, gamma);
  std::vector<RowIO> io(vs.begin(), vs.end());
  RowIO o(out);
  parallel_for(rows, row_grain(m * d), [&](int64_t b, int64_t e) {
    Scratch s(m, d);
    for (int64_t row = b; row < e; ++row) {
      s.load(io, row, d);
      row_scores(s.v.data(), m, c.data(), static_cast<float>(eps), d, nullptr, s.a.data(),
                 s.r.data(), s.p.data(), s.dp.data());
      float* dst = o.f32 ? o.row_f32(row, d) : s.extra(m, d, 0);
      for (int64_t i = 0; i < m; ++i) scale_add(dst, s.p[i], s.v[i], d, i > 0);
      o.store(row, d, dst);
    }
  });
}

void attn_res_backward_cpu(const std::vector<Tensor>& vs, const Tensor& w, const Tensor& gamma,
                           double eps, const Tensor& gy, std::vector<Tensor>& gvs, Tensor& gw,
                           Tensor& ggamma) {
  check_row_dtype("attn_res_backward", gy.dtype());
  const int64_t rows = gy.shape()[0], d = gy.shape()[1], m = static_cast<int64_t>(vs.size());
  const std::vector<float> c = pseudo_query(w, gamma);
  std::vector<RowIO> io(vs.begin(), vs.end()), gio(gvs.begin(), gvs.end());
  RowIO ig(gy);
  const bool f32 = ig.f32;
  // One gc partial per chunk of rows; the chunking depends only on rows and the thread count.
  const int64_t grain = row_grain(m * d);
  const int64_t chunks =
      std::max<int64_t>(1, std::min<int64_t>(omp_get_max_threads(), (rows + grain - 1) / grain));
  std::vector<float> partial(chunks * d, 0.0f);
  parallel_for(chunks, 1, [&](int64_t cb, int64_t ce) {
    Scratch s(m, d);
    for (int64_t ch = cb; ch < ce; ++ch) {
      float* gc = partial.data() + ch * d;
      for (int64_t row = rows * ch / chunks; row < rows * (ch + 1) / chunks; ++row) {
        s.load(io, row, d);
        const float* g = ig.load(row, d, s.extra(m, d, 0));
        row_scores(s.v.data(), m, c.data(), static_cast<float>(eps), d, g, s.a.data(), s.r.data(),
                   s.p.data(), s.dp.data());
        float mean_dp = 0;
        for (int64_t i = 0; i < m; ++i) mean_dp += s.p[i] * s.dp[i];
        for (int64_t i = 0; i < m; ++i) {
          float* dst = f32 ? gio[i].row_f32(row, d) : s.extra(m, d, 1);
          source_grad(s.v[i], g, c.data(), s.p[i], s.p[i] * (s.dp[i] - mean_dp), s.r[i], s.a[i], d,
                      dst, gc);
          gio[i].store(row, d, dst);
        }
      }
    }
  });
  for (int64_t ch = 1; ch < chunks; ++ch)
    scale_add(partial.data(), 1.0f, partial.data() + ch * d, d, true);
  // gw = gc ⊙ gamma, ggamma = gc ⊙ w.
  std::vector<float> bw(d), bg(d), tw(d), tg(d);
  const float* pw = RowIO(w).load(0, d, bw.data());
  const float* pg = RowIO(gamma).load(0, d, bg.data());
  for (int64_t k = 0; k < d; ++k) tw[k] = partial[k] * pg[k], tg[k] = partial[k] * pw[k];
  RowIO(gw).store(0, d, tw.data());
  RowIO(ggamma).store(0, d, tg.data());
}

}  // namespace

MYRIAD_REGISTER_KERNEL(ops::attn_res_kernels, ops::Backend::CPU, &attn_res_cpu);
MYRIAD_REGISTER_KERNEL(ops::attn_res_backward_kernels, ops::Backend::CPU, &attn_res_backward_cpu);

}  // namespace myriad::cpu
