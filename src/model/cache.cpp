#include "model/cache.h"

namespace myriad::model {

size_t DecodeCache::bytes() const {
  size_t n = 0;
  for (const auto& s : kda) {
    if (s.conv_BCK.defined()) n += s.conv_BCK.nbytes();
    if (s.S_BHKV.defined()) n += s.S_BHKV.nbytes();
  }
  for (const auto& s : mla)
    for (const Tensor* t :
         {&s.latent_BSC, &s.window_gate_BS, &s.admitted_BNC, &s.admitted_bias_BN, &s.latent_sum_BR})
      if (t->defined()) n += t->nbytes();
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
