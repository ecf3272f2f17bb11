// SentencePiece BPE tokenizer with byte fallback, trained deterministically (one thread, fixed
// settings), so the same corpus always yields the same model bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace myriad::data {

class Tokenizer {
 public:
  // Trains on docs (split into lines of at most a few KB) and writes the model to model_path.
  static Tokenizer train(const std::vector<std::string>& docs, int vocab_size,
                         const std::string& model_path);
  static Tokenizer load(const std::string& model_path);

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int vocab_size() const;
  int bos() const { return 1; }
  int eos() const { return 2; }
  int pad() const { return 3; }
  int unk() const { return 0; }

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  Tokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace myriad::data
