// Tokenizers, one interface over three kinds (kind()):
//  - "sentencepiece": the SentencePiece BPE with byte fallback that Myriad trains, trained
//    deterministically (one thread, fixed settings), so the same corpus always yields the same
//    model bytes. Its special tokens are control symbols: <s>, </s>, <pad> and the chat
//    template's markers (kChatMarkers); bos/eos/pad/unk are 1/2/3/0.
//  - "tiktoken" and "hf-bpe": the byte-level BPE tokenizers published checkpoints ship
//    (tiktoken.model as Kimi's, tokenizer.json as DeepSeek-V3's; data/bpe.h), encoding exactly as
//    the Python tiktoken and tokenizers packages do. bos/eos/pad/unk come from
//    tokenizer_config.json, -1 when it names none (pad() falls back to eos()).
// from_dir() picks the kind from the files of a model directory.
//
// encode() never yields a special token, whatever the text holds, so text from a client cannot
// forge a role or end marker (HF's split_special_tokens, llama.cpp's parse_special = false);
// only encode_parts() turns the literal text of a special token into its id, and only in the
// parts marked trusted (what a chat template itself wrote). (A tokenizer.json's non-special
// added tokens are ordinary vocabulary: the reference matches them in any text, and so does
// encode().) Any bytes encode, valid UTF-8 or not; decode() returns bytes, so one token may end
// inside a UTF-8 character.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace myriad::data {

class BpeTokenizer;

// The default chat template's role and end markers, control tokens of every tokenizer Myriad
// trains (ids 4..8, after unk, bos, eos, pad).
inline constexpr const char* kChatMarkers[] = {"<|system|>", "<|user|>", "<|assistant|>",
                                               "<|tool|>", "<|end|>"};
// The image markers of Kimi K2.5's processor (MODEL.md §10), control tokens 9..12 of every
// tokenizer Myriad trains: an image is written <|media_begin|>image<|media_content|>, then one
// <|media_pad|> per merged image token, then <|media_end|>.
inline constexpr const char* kMediaMarkers[] = {"<|media_begin|>", "<|media_content|>",
                                                "<|media_pad|>", "<|media_end|>"};
inline constexpr int32_t kMediaPadId = 11;

// A piece of text to tokenize: trusted text may hold special tokens (written as their literal
// text); untrusted text is always plain text.
struct TextPart {
  std::string_view text;
  bool trusted = false;
};

class Tokenizer {
 public:
  // Trains on docs (split into lines of at most a few KB) and writes the model to model_path.
  static Tokenizer train(const std::vector<std::string>& docs, int vocab_size,
                         const std::string& model_path);
  static Tokenizer load(const std::string& model_path);
  // The tokenizer of a model directory, by the files present: tiktoken.model (with
  // tokenizer_config.json), else tokenizer.json, else tokenizer.model (SentencePiece, as load()).
  static Tokenizer from_dir(const std::string& dir);
  std::string kind() const;  // "sentencepiece" | "tiktoken" | "hf-bpe"

  // Plain text: never yields a special token id.
  std::vector<int32_t> encode(std::string_view text) const;
  // Parts in order: in a trusted part the literal text of a special token becomes its id; all
  // other text (runs of adjacent parts together) is encoded as plain text.
  std::vector<int32_t> encode_parts(const std::vector<TextPart>& parts) const;
  // Text of ids; special tokens other than bos/eos/pad come out as their literal text (so a stop
  // string such as "<|end|>" matches the generated marker).
  std::string decode(const std::vector<int32_t>& ids) const;
  // The special tokens (control symbols) as (literal text, id), longest text first.
  const std::vector<std::pair<std::string, int32_t>>& special_tokens() const { return specials_; }
  bool is_special(int32_t id) const;
  // A byte-fallback piece <0x00> .. <0xFF>; for a byte-level BPE a token of one byte 0x80..0xFF
  // (part of a character, never a character of its own).
  bool is_byte(int32_t id) const;
  int vocab_size() const;
  // -1 when the tokenizer has none (only BPE tokenizers may lack one); pad() is eos() then.
  int bos() const { return bos_; }
  int eos() const { return eos_; }
  int pad() const { return pad_ >= 0 ? pad_ : eos_; }
  int unk() const { return unk_; }

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  Tokenizer();
  void index_specials();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;  // or
  std::unique_ptr<BpeTokenizer> bpe_;
  std::vector<std::pair<std::string, int32_t>> specials_;
  int32_t bos_ = 1, eos_ = 2, pad_ = 3, unk_ = 0;
};

}  // namespace myriad::data
