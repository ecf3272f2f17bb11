// Byte-level BPE tokenizers as published checkpoints ship them, with the encodings of the Python
// reference packages:
//
//  - tiktoken: tiktoken.model (lines `base64(token bytes) rank`) + tokenizer_config.json, as Kimi
//    Linear / K2 / K2.5 ship them. The pre-tokenizer is Kimi's pat_str (or the config's optional
//    "pat_str"); the ids past the ranks are added_tokens_decoder's special tokens and
//    <|reserved_token_{id}|> for the rest of Kimi's 256 reserved ids. Encoding is
//    tiktoken.Encoding's, after tokenization_kimi.py's split of the text into 400,000-character
//    chunks and runs of at most 25,000 whitespace or non-whitespace characters.
//  - hf-bpe: a Hugging Face tokenizer.json with a byte-level BPE model (DeepSeek-V3 style):
//    added tokens, no normalizer, a Split / ByteLevel pre-tokenizer sequence and the ByteLevel
//    decoder, as the `tokenizers` package encodes. Anything else is refused at load, naming it.
//
// The split regexes are translated to PCRE2 (Rust-regex class intersection `[a&&[^b]]` becomes a
// lookahead, `\s` the Unicode White_Space set, a script name `\p{Han}` its Script property).
// Text that is not valid UTF-8 still encodes: every maximal run of invalid bytes is one
// pre-token of its own (the references only take valid text), so decode(encode(bytes)) == bytes.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace myriad::data {

// A byte range [begin, end) of the text in which the literal text of a special token becomes its
// id (a trusted part); a special token must lie wholly inside one range.
struct ByteSpan {
  size_t begin = 0;
  size_t end = 0;
};

class BpeTokenizer {
 public:
  // dir holds tiktoken.model and tokenizer_config.json.
  static std::unique_ptr<BpeTokenizer> load_tiktoken(const std::string& dir);
  // dir holds tokenizer.json (and optionally tokenizer_config.json for bos/eos/pad/unk).
  static std::unique_ptr<BpeTokenizer> load_hf(const std::string& dir);
  ~BpeTokenizer();

  // Thread-safe. Special tokens are recognised only inside the trusted spans; non-special added
  // tokens of a tokenizer.json (which the reference matches in any text) everywhere.
  std::vector<int32_t> encode(std::string_view text, std::span<const ByteSpan> trusted = {}) const;
  // The bytes of a token: its literal text for an added or special token, nothing for an id
  // without a token (a gap in a tokenizer.json vocabulary). id must be in [0, vocab_size()).
  std::string_view token_bytes(int32_t id) const;
  int vocab_size() const;
  const std::string& kind() const;  // "tiktoken" | "hf-bpe"
  bool is_special(int32_t id) const;
  // The special tokens as (literal text, id), longest text first.
  const std::vector<std::pair<std::string, int32_t>>& special_tokens() const;
  // From tokenizer_config.json's bos_token / eos_token / pad_token / unk_token; -1 when absent.
  int32_t bos() const;
  int32_t eos() const;
  int32_t pad() const;
  int32_t unk() const;

  struct Impl;

 private:
  explicit BpeTokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Exposed for tests: a Rust-regex / Oniguruma pattern as PCRE2 compiles it (see above).
std::string bpe_pattern_to_pcre2(std::string_view pattern);

}  // namespace myriad::data
