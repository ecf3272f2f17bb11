// Optimised CPU depthwise causal conv1d, f32 and bf16 (computed in f32). Every loop runs over
// the contiguous channel dimension, so it vectorises; work is split over (batch, block of time
// steps). The weight gradient sums over batch and time: each of a fixed number of chunks of
// that work fills its own partial [K, C] buffer, and the partials are added in chunk order, so
// the result does not depend on the thread count.
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu.h"
#include "ops/conv1d.h"

namespace myriad::cpu {
namespace {

constexpr int64_t kTimeBlock = 32;

MYRIAD_CPU_CLONES void fma_row(float* acc, const float* w, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] += w[i] * x[i];
}
MYRIAD_CPU_CLONES void to_f32(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_load(src[i]);
}
MYRIAD_CPU_CLONES void from_f32(const float* src, uint16_t* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = bf16_store(src[i]);
}
void store_row(const float* src, const Tensor& t, int64_t off, int64_t n) {
  if (t.dtype() == DType::F32)
    std::memcpy(t.data<float>() + off, src, n * sizeof(float));
  else
    from_f32(src, t.data<uint16_t>() + off, n);
}
inline float load_at(const Tensor& t, const void* p, int64_t i) {
  return t.dtype() == DType::F32 ? static_cast<const float*>(p)[i]
                                 : bf16_load(static_cast<const uint16_t*>(p)[i]);
}

// f32 rows of a [B, T, C] tensor for one batch: row q of t for 0 <= q < T; for q < 0, column
// q + P of state [B, C, P] (zeros without a state); zeros for q >= T. f32 rows inside t are
// used in place; the others are converted into a local buffer.
class Rows {
 public:
  Rows(const Tensor& t, const Tensor& state, int64_t P)
      : t_(t), state_(state), T_(t.shape()[1]), C_(t.shape()[2]), P_(P) {}
  void load(int64_t b, int64_t q0, int64_t q1) {
    q0_ = q0;
    buf_.resize((q1 - q0) * C_);
    ptr_.resize(q1 - q0);
    const bool f32 = t_.dtype() == DType::F32;
    for (int64_t q = q0; q < q1; ++q) {
      float* d = buf_.data() + (q - q0) * C_;
      ptr_[q - q0] = d;
      if (q >= 0 && q < T_ && f32) {
        ptr_[q - q0] = t_.data<float>() + (b * T_ + q) * C_;
      } else if (q >= 0 && q < T_) {
        to_f32(t_.data<uint16_t>() + (b * T_ + q) * C_, d, C_);
      } else if (q < 0 && state_.defined()) {
        const void* ps = state_.data_ptr();
        for (int64_t c = 0; c < C_; ++c) d[c] = load_at(state_, ps, (b * C_ + c) * P_ + q + P_);
      } else {
        std::fill(d, d + C_, 0.0f);
      }
    }
  }
  const float* operator[](int64_t q) const { return ptr_[q - q0_]; }

 private:
  const Tensor& t_;
  const Tensor& state_;
  int64_t T_, C_, P_, q0_ = 0;
  std::vector<float> buf_;
  std::vector<const float*> ptr_;
};

// w [C, K] as f32 taps [K, C], so each tap is a contiguous row over channels.
std::vector<float> taps(const Tensor& w) {
  const int64_t C = w.shape()[0], K = w.shape()[1];
  std::vector<float> wt(K * C);
  const void* pw = w.data_ptr();
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) wt[j * C + c] = load_at(w, pw, c * K + j);
  return wt;
}

// Decode-sized f32 (T < K): channel by channel, straight from w [C, K] and state [B, C, P], with
// no transposed copies; the sum runs over the taps in the same order as the row path, so a step
// gives the bits of the same position in a longer pass.
MYRIAD_CPU_CLONES void conv_channels(const float* x, const float* w, const float* state, float* y,
                                     int64_t T, int64_t C, int64_t K) {
  const int64_t P = K - 1;
  for (int64_t c = 0; c < C; ++c) {
    const float* wc = w + c * K;
    for (int64_t t = 0; t < T; ++t) {
      float acc = 0.0f;
      for (int64_t j = 0; j < K; ++j) {
        const int64_t q = t - P + j;  // position in x; below 0 the state's column q + P
        const float v = q >= 0 ? x[q * C + c] : state ? state[c * P + q + P] : 0.0f;
        acc += wc[j] * v;
      }
      y[t * C + c] = acc;
    }
  }
}

void check_float(DType t) {
  MYRIAD_CHECK(t == DType::F32 || t == DType::BF16,
               "conv1d_causal: the cpu kernel supports f32 and bf16, not ", dtype_name(t));
}

int64_t grain_for(int64_t work_per_unit) {
  return std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(work_per_unit, 1));
}

void conv1d_cpu(const Tensor& x, const Tensor& w, const Tensor& state, Tensor& y) {
  check_float(x.dtype());
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], K = w.shape()[1], P = K - 1;
  if (T < K && x.dtype() == DType::F32 && w.dtype() == DType::F32) {
    const float* s = state.defined() ? state.data<float>() : nullptr;
    for (int64_t b = 0; b < B; ++b)
      conv_channels(x.data<float>() + b * T * C, w.data<float>(), s ? s + b * C * P : nullptr,
                    y.data<float>() + b * T * C, T, C, K);
    return;
  }
  const std::vector<float> wt = taps(w);
  const int64_t nblk = (T + kTimeBlock - 1) / kTimeBlock;
  parallel_for(B * nblk, grain_for(kTimeBlock * C * K), [&](int64_t u0, int64_t u1) {
    Rows rows(x, state, P);
    std::vector<float> acc(C);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / nblk, t0 = (u % nblk) * kTimeBlock, t1 = std::min(T, t0 + kTimeBlock);
      rows.load(b, t0 - P, t1);
      for (int64_t t = t0; t < t1; ++t) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < K; ++j) fma_row(acc.data(), wt.data() + j * C, rows[t - P + j], C);
        store_row(acc.data(), y, (b * T + t) * C, C);
      }
    }
  });
}

void conv1d_backward_cpu(const Tensor& x, const Tensor& w, const Tensor& state, const Tensor& gy,
                         Tensor& gx, Tensor& gw, Tensor& gstate) {
  check_float(x.dtype());
  const int64_t B = x.shape()[0], T = x.shape()[1], C = x.shape()[2], K = w.shape()[1], P = K - 1;
  const std::vector<float> wt = taps(w);
  const Tensor none;
  // Input side: gxpad[p] = sum_j w[:, j] * gy[p - j] for p in [0, T + P); rows p >= P are gx,
  // rows p < P go (transposed) to gstate.
  const int64_t npad = (T + P + kTimeBlock - 1) / kTimeBlock;
  parallel_for(B * npad, grain_for(kTimeBlock * C * K), [&](int64_t u0, int64_t u1) {
    Rows g(gy, none, 0);
    std::vector<float> acc(C);
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t b = u / npad, p0 = (u % npad) * kTimeBlock;
      const int64_t p1 = std::min(T + P, p0 + kTimeBlock);
      g.load(b, p0 - P, p1);
      for (int64_t p = p0; p < p1; ++p) {
        if (p < P && !gstate.defined()) continue;
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t j = 0; j < K; ++j) fma_row(acc.data(), wt.data() + j * C, g[p - j], C);
        if (p >= P) {
          store_row(acc.data(), gx, (b * T + p - P) * C, C);
        } else {
          for (int64_t c = 0; c < C; ++c) {
            const int64_t at = (b * C + c) * P + p;
            if (gstate.dtype() == DType::F32)
              gstate.data<float>()[at] = acc[c];
            else
              gstate.data<uint16_t>()[at] = bf16_store(acc[c]);
          }
        }
      }
    }
  });
  // Weight side: gw[c, j] = sum_{b, t} gy[b, t, c] * xpad[b, t + j, c], in fixed chunks.
  const int64_t nblk = (T + kTimeBlock - 1) / kTimeBlock, units = B * nblk;
  const int64_t chunks = std::min<int64_t>(units, 64);
  std::vector<float> part(chunks * K * C, 0.0f);
  parallel_for(chunks, 1, [&](int64_t c0, int64_t c1) {
    Rows xr(x, state, P), g(gy, none, 0);
    for (int64_t ch = c0; ch < c1; ++ch) {
      float* acc = part.data() + ch * K * C;
      for (int64_t u = units * ch / chunks; u < units * (ch + 1) / chunks; ++u) {
        const int64_t b = u / nblk, t0 = (u % nblk) * kTimeBlock;
        const int64_t t1 = std::min(T, t0 + kTimeBlock);
        xr.load(b, t0 - P, t1);
        g.load(b, t0, t1);
        for (int64_t t = t0; t < t1; ++t)
          for (int64_t j = 0; j < K; ++j) fma_row(acc + j * C, g[t], xr[t - P + j], C);
      }
    }
  });
  std::vector<float> sum(K * C, 0.0f);
  for (int64_t ch = 0; ch < chunks; ++ch)
    for (int64_t i = 0; i < K * C; ++i) sum[i] += part[ch * K * C + i];
  std::vector<float> gwc(C * K);
  for (int64_t c = 0; c < C; ++c)
    for (int64_t j = 0; j < K; ++j) gwc[c * K + j] = sum[j * C + c];
  store_row(gwc.data(), gw, 0, C * K);
}

}  // namespace
MYRIAD_REGISTER_KERNEL(ops::conv1d_kernels, ops::Backend::CPU, &conv1d_cpu);
MYRIAD_REGISTER_KERNEL(ops::conv1d_backward_kernels, ops::Backend::CPU, &conv1d_backward_cpu);
}  // namespace myriad::cpu
