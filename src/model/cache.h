// Decode state (MODEL.md §3.3, §4.8, §9): per KDA layer a constant-size recurrent state and conv
// state, per MLA layer the growing cache of [ĉ (r_kv) ; k^pe (d_pe)] latents. Nothing for MoE,
// SiTU or AttnRes. With the MLA admission gate (MODEL.md §12.4) an MLA layer instead keeps a window
// of the last W latents plus the admitted set and the running latent sum of the prefix mean.
// A fresh cache is empty; Decoder::forward fills and extends it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "model/config.h"

namespace myriad::model {

struct KdaState {
  Tensor conv_BCK;  // [B, 3P, K-1]: the last K-1 pre-conv [q̂; k̂; v̂] inputs
  Tensor S_BHKV;    // [B, H, d_k, d_v] f32
};

// Paged latent storage for one sequence and MLA layer (set up by the inference engine; B = 1):
// fixed-size pages [block_tokens, r_kv + d_pe] taken from the engine's pool, listed oldest first
// in the block table. With max_pages > 0 it is a sliding window: when the table is full the
// oldest page is reused for the newest tokens (MlaLayer attends over the kept pages plus the
// tokens of the current call, so every query sees at least the last (max_pages - 1) pages).
struct LatentPages {
  int64_t block_tokens = 0;
  int64_t max_pages = 0;          // 0: unlimited
  std::vector<Tensor> table;      // the block table
  int64_t length = 0;             // tokens held in the table
  int64_t dropped = 0;            // tokens that slid out of the window
  std::function<Tensor()> alloc;  // a fresh page from the pool
  // Appends lat [1, T, C] (the oldest pages recycled when the window is full).
  void append(const Tensor& lat_1TC);
  // The held latents, oldest first, as one [1, length, C] tensor (a copy); undefined when empty.
  Tensor gather() const;
};

struct MlaState {
  // [B, S, r_kv + d_pe]; k^pe stored already rotated under RoPE. With the admission gate: the
  // window, the last min(W, tokens) latents (a ring buffer of W, kept in order).
  Tensor latent_BSC;
  std::shared_ptr<LatentPages> pages;  // when set: the latents live there, not in latent_BSC
  int64_t length() const {
    return pages ? pages->length : latent_BSC.defined() ? latent_BSC.size(1) : 0;
  }
  // Admission gate only. Gates and log-gates are f32 (f64 for f64 models).
  Tensor window_gate_BS;    // a_j of the window's keys, decided on when they leave it
  Tensor admitted_BNC;      // latents admitted to the long-term cache (a_j >= tau_adm)
  Tensor admitted_bias_BN;  // their log max(a_j, 1e-6); -inf pads rows that admitted fewer
  Tensor latent_sum_BR;     // Σ ĉ_s over the tokens so far (for the prefix mean m)
  int64_t count = 0;        // how many tokens latent_sum_BR holds
  int64_t admitted() const { return admitted_BNC.defined() ? admitted_BNC.size(1) : 0; }
};

struct DecodeCache {
  int64_t position = 0;       // tokens processed so far
  std::vector<KdaState> kda;  // indexed by layer (unused for MLA layers)
  std::vector<MlaState> mla;  // indexed by layer (unused for KDA layers)
  explicit DecodeCache(int64_t num_layers = 0) : kda(num_layers), mla(num_layers) {}
  size_t bytes() const;  // what the held tensors occupy
};

// Cache sizes for a config, with `bytes_per_value` for the stored dtype (2 for bf16).
struct CacheSizes {
  int64_t mla_bytes_per_token_per_layer = 0;  // (r_kv + d_pe) values
  int64_t mla_bytes_per_token = 0;            // all MLA layers
  int64_t kda_state_bytes_per_layer = 0;      // H·d_k·d_v values (f32: 4 bytes)
  int64_t kda_conv_bytes_per_layer = 0;       // 3P·(K-1) values
  int64_t kda_bytes = 0;                      // all KDA layers, state + conv
  int64_t bytes_at(int64_t tokens) const { return kda_bytes + mla_bytes_per_token * tokens; }
};
CacheSizes cache_sizes(const ModelConfig& c, int64_t bytes_per_value = 2,
                       int64_t state_bytes_per_value = 4);

}  // namespace myriad::model
