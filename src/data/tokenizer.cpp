#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <unordered_map>

#include "core/error.h"
#include "data/bpe.h"

namespace myriad::data {
namespace {

constexpr size_t kMaxLine = 4000;  // SentencePiece skips longer training sentences

// Feeds documents to the trainer as lines no longer than kMaxLine, cut at spaces.
class DocLines : public sentencepiece::SentenceIterator {
 public:
  explicit DocLines(const std::vector<std::string>& docs) : docs_(docs) { Next(); }
  bool done() const override { return doc_ >= docs_.size(); }
  void Next() override {
    while (doc_ < docs_.size()) {
      const std::string& d = docs_[doc_];
      while (pos_ < d.size() && (d[pos_] == '\n' || d[pos_] == ' ')) ++pos_;
      if (pos_ < d.size()) {
        size_t end = std::min(d.size(), pos_ + kMaxLine);
        if (size_t nl = d.find('\n', pos_); nl != std::string::npos && nl < end) end = nl;
        if (end < d.size() && d[end] != '\n') {
          size_t sp = d.rfind(' ', end);
          if (sp != std::string::npos && sp > pos_) end = sp;
        }
        value_ = d.substr(pos_, end - pos_);
        pos_ = end;
        return;
      }
      ++doc_;
      pos_ = 0;
    }
  }
  const std::string& value() const override { return value_; }
  sentencepiece::util::Status status() const override { return {}; }

 private:
  const std::vector<std::string>& docs_;
  size_t doc_ = 0, pos_ = 0;
  std::string value_;
};

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;
Tokenizer::~Tokenizer() = default;

Tokenizer Tokenizer::train(const std::vector<std::string>& docs, int vocab_size,
                           const std::string& model_path) {
  MYRIAD_CHECK(!docs.empty(), "Tokenizer::train: empty corpus");
  MYRIAD_CHECK(vocab_size >= 300, "Tokenizer::train: vocab_size ", vocab_size,
               " is too small (byte fallback needs 256 byte pieces plus specials)");
  std::string markers;
  for (const char* m : kChatMarkers) {
    if (!markers.empty()) markers += ',';
    markers += m;
  }
  for (const char* m : kMediaMarkers) markers.append(",").append(m);
  const std::unordered_map<std::string, std::string> args = {
      {"control_symbols", markers},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"byte_fallback", "true"},
      {"character_coverage", "0.9995"},
      {"split_digits", "true"},  // numbers (pass keys) become digit sequences
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},  // exact round trip
      {"allow_whitespace_only_pieces", "true"},
      {"hard_vocab_limit", "false"},
      {"num_threads", "1"},  // determinism
      {"input_sentence_size", "0"},
      {"shuffle_input_sentence", "false"},
      {"max_sentence_length", std::to_string(kMaxLine * 4)},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "3"},
      {"minloglevel", "2"},
  };
  DocLines lines(docs);
  std::string proto;
  auto st = sentencepiece::SentencePieceTrainer::Train(args, &lines, &proto);
  MYRIAD_CHECK(st.ok(), "Tokenizer::train: SentencePiece failed: ", st.ToString());
  {
    std::ofstream f(model_path, std::ios::binary | std::ios::trunc);
    MYRIAD_CHECK(f, "Tokenizer::train: cannot write ", model_path);
    f.write(proto.data(), static_cast<std::streamsize>(proto.size()));
    MYRIAD_CHECK(f.good(), "Tokenizer::train: write to ", model_path, " failed");
  }
  Tokenizer t;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  st = t.sp_->LoadFromSerializedProto(proto);
  MYRIAD_CHECK(st.ok(), "Tokenizer::train: cannot load the trained model: ", st.ToString());
  t.index_specials();
  return t;
}

Tokenizer Tokenizer::load(const std::string& model_path) {
  Tokenizer t;
  t.sp_ = std::make_unique<sentencepiece::SentencePieceProcessor>();
  auto st = t.sp_->Load(model_path);
  MYRIAD_CHECK(st.ok(), "Tokenizer::load: ", model_path, ": ", st.ToString());
  MYRIAD_CHECK(t.sp_->bos_id() == 1 && t.sp_->eos_id() == 2 && t.sp_->pad_id() == 3,
               "Tokenizer::load: ", model_path,
               " was not trained by Myriad (expected bos=1 eos=2 pad=3)");
  t.index_specials();
  return t;
}

Tokenizer Tokenizer::from_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  MYRIAD_CHECK(fs::is_directory(dir), "Tokenizer::from_dir: ", dir, " is not a directory");
  const fs::path d(dir);
  if (fs::exists(d / "tiktoken.model") || fs::exists(d / "tokenizer.json")) {
    Tokenizer t;
    t.bpe_ = fs::exists(d / "tiktoken.model") ? BpeTokenizer::load_tiktoken(dir)
                                              : BpeTokenizer::load_hf(dir);
    t.specials_ = t.bpe_->special_tokens();
    t.bos_ = t.bpe_->bos(), t.eos_ = t.bpe_->eos(), t.pad_ = t.bpe_->pad(), t.unk_ = t.bpe_->unk();
    return t;
  }
  if (fs::exists(d / "tokenizer.model")) return load((d / "tokenizer.model").string());
  throw Error(cat("Tokenizer::from_dir: ", dir,
                  " has no tokenizer: looked for tiktoken.model (with tokenizer_config.json), ",
                  "tokenizer.json and tokenizer.model"));
}

std::string Tokenizer::kind() const {
  return bpe_ ? bpe_->kind() : "sentencepiece";
}

void Tokenizer::index_specials() {
  specials_.clear();
  for (int id = 0; id < sp_->GetPieceSize(); ++id)
    if (sp_->IsControl(id)) specials_.emplace_back(sp_->IdToPiece(id), id);
  std::stable_sort(specials_.begin(), specials_.end(),
                   [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
}

bool Tokenizer::is_special(int32_t id) const {
  if (bpe_) return bpe_->is_special(id);
  return id >= 0 && id < vocab_size() && sp_->IsControl(id);
}

bool Tokenizer::is_byte(int32_t id) const {
  if (bpe_) {
    if (id < 0 || id >= vocab_size() || bpe_->is_special(id)) return false;
    const std::string_view b = bpe_->token_bytes(id);
    return b.size() == 1 && static_cast<unsigned char>(b[0]) >= 0x80;
  }
  return id >= 0 && id < vocab_size() && sp_->IsByte(id);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  if (bpe_) return bpe_->encode(text);
  std::vector<int> ids;
  auto st = sp_->Encode(text, &ids);
  MYRIAD_CHECK(st.ok(), "Tokenizer::encode: ", st.ToString());
  return {ids.begin(), ids.end()};
}

std::vector<int32_t> Tokenizer::encode_parts(const std::vector<TextPart>& parts) const {
  if (bpe_) {
    // One text, so the pre-tokenizer sees the parts together; specials only inside trusted ones.
    std::string text;
    std::vector<ByteSpan> trusted;
    for (const TextPart& p : parts) {
      if (p.trusted) trusted.push_back({text.size(), text.size() + p.text.size()});
      text += p.text;
    }
    return bpe_->encode(text, trusted);
  }
  std::vector<int32_t> out;
  std::string plain;  // text not yet encoded
  const auto flush = [&] {
    if (plain.empty()) return;
    const auto ids = encode(plain);
    out.insert(out.end(), ids.begin(), ids.end());
    plain.clear();
  };
  for (const TextPart& p : parts) {
    if (!p.trusted) {
      plain += p.text;
      continue;
    }
    size_t i = 0;
    while (i < p.text.size()) {
      const auto hit = std::find_if(specials_.begin(), specials_.end(), [&](const auto& sp) {
        return p.text.compare(i, sp.first.size(), sp.first) == 0;
      });
      if (hit == specials_.end()) {
        plain += p.text[i++];
        continue;
      }
      flush();
      out.push_back(hit->second);
      i += hit->first.size();
    }
  }
  flush();
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    MYRIAD_CHECK(id >= 0 && id < vocab_size(), "Tokenizer::decode: id ", id,
                 " outside the vocabulary [0, ", vocab_size(), ")");
  if (bpe_) {
    std::string out;
    for (int32_t id : ids)
      if (!is_special(id) || (id != bos() && id != eos() && id != pad()))
        out += bpe_->token_bytes(id);
    return out;
  }
  // Runs of ids between markers decode as SentencePiece does (bos/eos/pad to nothing).
  std::string out;
  std::vector<int> run;
  const auto flush = [&] {
    std::string text;
    auto st = sp_->Decode(run, &text);
    MYRIAD_CHECK(st.ok(), "Tokenizer::decode: ", st.ToString());
    out += text;
    run.clear();
  };
  for (int32_t id : ids) {
    if (is_special(id) && id != bos() && id != eos() && id != pad()) {
      flush();
      out += sp_->IdToPiece(id);
    } else {
      run.push_back(id);
    }
  }
  flush();
  return out;
}

int Tokenizer::vocab_size() const {
  return bpe_ ? bpe_->vocab_size() : sp_->GetPieceSize();
}

}  // namespace myriad::data
