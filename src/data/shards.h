// Binary token shards and the packed, shuffled, resumable stream that reads them.
//
// Shard file (little-endian): a 64-byte header {magic "MYRSHARD", u32 version, u32 header bytes,
// u64 n_tokens, u64 n_docs, u64 checksum, u32 vocab_size, u32 eos, u8 weighted, 15 reserved
// bytes}, then n_tokens i32 tokens (every document followed by eos), then n_docs u64 document
// start offsets, then, when `weighted` is 1, n_tokens u8 loss weights (the weight of predicting
// that token: 0 leaves it out of the loss, k > 1 counts it k times). The checksum is a 64-bit
// FNV-1a over the token and start words, then the weights. out_dir/meta.json lists the shards of
// the "train" and "heldout" splits.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "data/tokenizer.h"
#include "vision/tower.h"

namespace myriad::data {

struct ShardStats {
  int64_t train_docs = 0, heldout_docs = 0, train_tokens = 0, heldout_tokens = 0;
  int64_t train_shards = 0, heldout_shards = 0;
};

// Tokenises docs and writes shards of about shard_tokens tokens (documents never straddle
// shards); a seeded permutation sends round(heldout_fraction * docs) documents to "heldout".
ShardStats write_token_shards(const std::vector<std::string>& docs, const Tokenizer& tokenizer,
                              const std::string& out_dir, int64_t shard_tokens,
                              double heldout_fraction, uint64_t seed);
// The same from already-tokenised documents (without their eos), with per-token loss weights when
// `weights` is given (one list per document, each as long as its document or empty for all 1).
ShardStats write_token_shards(const std::vector<std::vector<int32_t>>& docs, int vocab_size,
                              int eos, const std::string& out_dir, int64_t shard_tokens,
                              double heldout_fraction, uint64_t seed,
                              const std::vector<std::vector<uint8_t>>* weights = nullptr);

struct Batch {
  Tensor input_ids, labels;  // i64 [B, T]; labels are the inputs shifted by one
  Tensor loss_weights;       // f32 [B, T], each label's loss weight; undefined: unweighted shards
  std::vector<std::vector<int64_t>> doc_starts;  // per row: positions where a document begins
  // Multimodal rows (vision::ImageTextStream): the processed images of the batch, row after row,
  // whose merged tokens fill the rows' <|media_pad|> placeholders in order; undefined: text only.
  Tensor pixel_values;
  std::vector<vision::Grid> grids;
};

// Documents of one split, in a seeded random order that changes every epoch, concatenated and cut
// into rows of T tokens (each row's labels take one token past it).
class TokenStream {
 public:
  struct State {
    uint64_t seed = 0;
    std::string split;
    int64_t epoch = 0, doc = 0, offset = 0;  // position: doc-th document of the epoch's order
    int64_t n_docs = 0;                      // guards against restoring onto other data
    std::string to_json() const;
    static State from_json(const std::string& json);
  };

  TokenStream(const std::string& dir, const std::string& split, uint64_t seed);
  ~TokenStream();
  TokenStream(TokenStream&&) noexcept;

  // B rows of T tokens. align: every row starts at a document start (the rest of a document the
  // previous row cut off is skipped), so a document of up to T tokens is always seen whole; the
  // long-context mixes use it so a retrieval item's needle and question share a row.
  Batch next(int64_t B, int64_t T, bool align = false);
  State state() const;
  void restore(const State& s);

  int64_t num_docs() const;
  int64_t num_tokens() const;
  int vocab_size() const;
  int eos() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace myriad::data
