#include "model/cache.h"

#include <algorithm>

#include "core/error.h"
#include "ops/shape.h"

namespace myriad::model {

void LatentPages::append(const Tensor& lat) {
  MYRIAD_CHECK(lat.dim() == 3 && lat.size(0) == 1, "paged cache: latents must be [1, T, C], got ",
               lat.desc());
  const int64_t T = lat.size(1), C = lat.size(2), bt = block_tokens;
  for (int64_t t = 0; t < T;) {
    const int64_t off = length % bt;
    if (off == 0 && length == static_cast<int64_t>(table.size()) * bt) {
      if (max_pages > 0 && static_cast<int64_t>(table.size()) == max_pages) {
        std::rotate(table.begin(), table.begin() + 1, table.end());  // reuse the oldest page
        length -= bt, dropped += bt;
      } else {
        table.push_back(alloc());
        MYRIAD_CHECK(table.back().shape() == Shape({bt, C}), "paged cache: a page must be [", bt,
                     ", ", C, "], got ", table.back().desc());
      }
    }
    const int64_t n = std::min(bt - off, T - t);
    Tensor dst = ops::slice(table[length / bt], 0, off, off + n);
    dst.copy_(ops::reshape(ops::slice(lat, 1, t, t + n), {n, C}));
    length += n, t += n;
  }
}

Tensor LatentPages::gather() const {
  if (length == 0) return Tensor();
  std::vector<Tensor> parts;
  for (int64_t k = 0; k * block_tokens < length; ++k)
    parts.push_back(ops::slice(table[k], 0, 0, std::min(block_tokens, length - k * block_tokens)));
  return ops::unsqueeze(parts.size() == 1 ? ops::contiguous(parts[0]) : ops::concat(parts, 0), 0);
}

size_t DecodeCache::bytes() const {
  size_t n = 0;
  for (const auto& s : kda) {
    if (s.conv_BCK.defined()) n += s.conv_BCK.nbytes();
    if (s.S_BHKV.defined()) n += s.S_BHKV.nbytes();
  }
  for (const auto& s : mla) {
    if (s.pages)
      for (const Tensor& p : s.pages->table) n += p.nbytes();
    for (const Tensor* t :
         {&s.latent_BSC, &s.window_gate_BS, &s.admitted_BNC, &s.admitted_bias_BN, &s.latent_sum_BR})
      if (t->defined()) n += t->nbytes();
  }
  return n;
}

CacheSizes cache_sizes(const ModelConfig& c, int64_t bytes_per_value,
                       int64_t state_bytes_per_value) {
  CacheSizes s;
  const auto& lac = c.linear_attn_config;
  const int64_t P = lac.num_heads * lac.head_dim;
  s.mla_bytes_per_token_per_layer = (c.kv_lora_rank + c.qk_rope_head_dim) * bytes_per_value;
  s.kda_state_bytes_per_layer = lac.num_heads * lac.head_dim * lac.head_dim * state_bytes_per_value;
  s.kda_conv_bytes_per_layer = 3 * P * (lac.short_conv_kernel_size - 1) * bytes_per_value;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (c.is_mla_layer(i))
      s.mla_bytes_per_token += s.mla_bytes_per_token_per_layer;
    else
      s.kda_bytes += s.kda_state_bytes_per_layer + s.kda_conv_bytes_per_layer;
  }
  return s;
}

}  // namespace myriad::model
