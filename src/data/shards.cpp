#include "data/shards.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "data/corpus.h"

namespace myriad::data {
namespace {

constexpr char kMagic[8] = {'M', 'Y', 'R', 'S', 'H', 'A', 'R', 'D'};
constexpr uint32_t kVersion = 1;

struct Header {
  char magic[8];
  uint32_t version, header_bytes;
  uint64_t n_tokens, n_docs, checksum;
  uint32_t vocab_size, eos;
  uint8_t weighted;  // 1: a u8 loss weight per token follows the document starts
  uint8_t reserved[15];
};
static_assert(sizeof(Header) == 64);

uint64_t fnv(const void* p, size_t bytes, uint64_t h = 0xcbf29ce484222325ull) {
  const auto* b = static_cast<const uint8_t*>(p);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ b[i]) * 0x100000001b3ull;
  return h;
}

class ShardWriter {
 public:
  ShardWriter(std::string dir, std::string split, int vocab, int eos, int64_t limit, bool weighted)
      : dir_(std::move(dir)),
        split_(std::move(split)),
        vocab_(vocab),
        eos_(eos),
        limit_(limit),
        weighted_(weighted) {}
  // weights: one per token of doc, or empty (all 1); the eos after the document weighs 1.
  void add(const std::vector<int32_t>& doc, const std::vector<uint8_t>& weights) {
    const int64_t n = static_cast<int64_t>(doc.size()) + 1;
    if (!tokens_.empty() && static_cast<int64_t>(tokens_.size()) + n > limit_) flush();
    starts_.push_back(tokens_.size());
    tokens_.insert(tokens_.end(), doc.begin(), doc.end());
    tokens_.push_back(eos_);
    if (weighted_) {
      MYRIAD_CHECK(weights.empty() || weights.size() == doc.size(),
                   "write_token_shards: ", weights.size(), " loss weights for a document of ",
                   doc.size(), " tokens");
      if (weights.empty())
        weights_.insert(weights_.end(), doc.size(), 1);
      else
        weights_.insert(weights_.end(), weights.begin(), weights.end());
      weights_.push_back(1);
    }
    ++docs_;
    total_ += n;
  }
  void flush() {
    if (tokens_.empty()) return;
    char name[64];
    std::snprintf(name, sizeof name, "%s_%05zu.bin", split_.c_str(), files_.size());
    Header h{};
    std::memcpy(h.magic, kMagic, 8);
    h.version = kVersion;
    h.header_bytes = sizeof(Header);
    h.n_tokens = tokens_.size();
    h.n_docs = starts_.size();
    h.checksum = fnv(starts_.data(), starts_.size() * 8, fnv(tokens_.data(), tokens_.size() * 4));
    if (weighted_) h.checksum = fnv(weights_.data(), weights_.size(), h.checksum);
    h.weighted = weighted_ ? 1 : 0;
    h.vocab_size = static_cast<uint32_t>(vocab_);
    h.eos = static_cast<uint32_t>(eos_);
    const std::string path = dir_ + "/" + name;
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    MYRIAD_CHECK(f, "write_token_shards: cannot write ", path);
    f.write(reinterpret_cast<const char*>(&h), sizeof h);
    f.write(reinterpret_cast<const char*>(tokens_.data()),
            static_cast<std::streamsize>(tokens_.size() * 4));
    f.write(reinterpret_cast<const char*>(starts_.data()),
            static_cast<std::streamsize>(starts_.size() * 8));
    f.write(reinterpret_cast<const char*>(weights_.data()),
            static_cast<std::streamsize>(weights_.size()));
    MYRIAD_CHECK(f.good(), "write_token_shards: write to ", path, " failed");
    files_.push_back(name);
    tokens_.clear();
    starts_.clear();
    weights_.clear();
  }
  std::vector<std::string> files_;
  int64_t docs_ = 0, total_ = 0;

 private:
  std::string dir_, split_;
  int vocab_, eos_;
  int64_t limit_;
  bool weighted_;
  std::vector<int32_t> tokens_;
  std::vector<uint64_t> starts_;
  std::vector<uint8_t> weights_;
};

template <class GetDoc>
ShardStats write_shards(size_t n, GetDoc get, int vocab, int eos, const std::string& out_dir,
                        int64_t shard_tokens, double heldout_fraction, uint64_t seed,
                        const std::vector<std::vector<uint8_t>>* weights = nullptr) {
  MYRIAD_CHECK(!weights || weights->size() == n,
               "write_token_shards: ", weights ? weights->size() : 0, " weight lists for ", n,
               " documents");
  MYRIAD_CHECK(shard_tokens > 0, "write_token_shards: shard_tokens must be positive");
  MYRIAD_CHECK(heldout_fraction >= 0 && heldout_fraction < 1,
               "write_token_shards: heldout_fraction ", heldout_fraction, " not in [0, 1)");
  MYRIAD_CHECK(n > 0, "write_token_shards: no documents");
  std::filesystem::create_directories(out_dir);
  std::vector<size_t> perm(n);
  for (size_t i = 0; i < n; ++i) perm[i] = i;
  Rng rng(seed ^ 0x4e1d07ull);
  rng.shuffle(perm);
  std::vector<bool> heldout(n, false);
  const auto n_held = static_cast<size_t>(std::llround(heldout_fraction * static_cast<double>(n)));
  for (size_t i = 0; i < n_held; ++i) heldout[perm[i]] = true;
  // Weighted shards only when some document carries weights.
  const bool weighted = weights && std::any_of(weights->begin(), weights->end(),
                                               [](const auto& w) { return !w.empty(); });
  ShardWriter train(out_dir, "train", vocab, eos, shard_tokens, weighted);
  ShardWriter held(out_dir, "heldout", vocab, eos, shard_tokens, weighted);
  const std::vector<uint8_t> none;
  for (size_t i = 0; i < n; ++i)
    (heldout[i] ? held : train).add(get(i), weighted ? (*weights)[i] : none);
  train.flush();
  held.flush();
  nlohmann::json meta = {{"format", "myriad-token-shards"},
                         {"version", kVersion},
                         {"vocab_size", vocab},
                         {"eos", eos},
                         {"seed", seed},
                         {"heldout_fraction", heldout_fraction},
                         {"train", train.files_},
                         {"heldout", held.files_},
                         {"train_docs", train.docs_},
                         {"heldout_docs", held.docs_},
                         {"train_tokens", train.total_},
                         {"heldout_tokens", held.total_}};
  std::ofstream(out_dir + "/meta.json") << meta.dump(2) << "\n";
  return {train.docs_,
          held.docs_,
          train.total_,
          held.total_,
          static_cast<int64_t>(train.files_.size()),
          static_cast<int64_t>(held.files_.size())};
}

// A read-only memory map of one shard, validated on open.
struct MappedShard {
  std::string path;
  void* base = MAP_FAILED;
  size_t bytes = 0;
  const int32_t* tokens = nullptr;
  const char* starts_raw =
      nullptr;  // u64 document starts, only 4-byte aligned when n_tokens is odd
  uint64_t start(uint64_t d) const {
    uint64_t v;
    std::memcpy(&v, starts_raw + d * 8, 8);
    return v;
  }
  uint64_t n_tokens = 0, n_docs = 0;
  const uint8_t* weights = nullptr;  // per-token loss weights, or null (all 1)

  MappedShard(std::string p, int vocab, int eos) : path(std::move(p)) {
    int fd = ::open(path.c_str(), O_RDONLY);
    MYRIAD_CHECK(fd >= 0, "TokenStream: cannot open shard ", path);
    struct stat st {};
    ::fstat(fd, &st);
    bytes = static_cast<size_t>(st.st_size);
    if (bytes >= sizeof(Header)) base = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    MYRIAD_CHECK(bytes >= sizeof(Header), "TokenStream: shard ", path, " is truncated (", bytes,
                 " bytes, smaller than its header)");
    MYRIAD_CHECK(base != MAP_FAILED, "TokenStream: cannot map shard ", path);
    Header h;
    std::memcpy(&h, base, sizeof h);
    MYRIAD_CHECK(std::memcmp(h.magic, kMagic, 8) == 0, "TokenStream: ", path,
                 " is not a Myriad token shard (bad magic)");
    MYRIAD_CHECK(h.version == kVersion && h.header_bytes == sizeof(Header) && h.weighted <= 1,
                 "TokenStream: ", path, " has unsupported version ", h.version);
    n_tokens = h.n_tokens;
    n_docs = h.n_docs;
    const size_t want = sizeof(Header) + n_tokens * 4 + n_docs * 8 + (h.weighted ? n_tokens : 0);
    MYRIAD_CHECK(n_tokens < (1ull << 40) && n_docs <= n_tokens && bytes == want,
                 "TokenStream: ", path, " is truncated or corrupt: ", bytes, " bytes, header says ",
                 want);
    tokens = reinterpret_cast<const int32_t*>(static_cast<const char*>(base) + sizeof(Header));
    starts_raw = reinterpret_cast<const char*>(tokens + n_tokens);
    if (h.weighted) weights = reinterpret_cast<const uint8_t*>(starts_raw + n_docs * 8);
    uint64_t sum = fnv(starts_raw, n_docs * 8, fnv(tokens, n_tokens * 4));
    if (weights) sum = fnv(weights, n_tokens, sum);
    MYRIAD_CHECK(sum == h.checksum, "TokenStream: ", path, " is corrupt (checksum mismatch)");
    MYRIAD_CHECK(static_cast<int>(h.vocab_size) == vocab && static_cast<int>(h.eos) == eos,
                 "TokenStream: ", path, " disagrees with meta.json on vocab/eos");
    for (uint64_t d = 0; d < n_docs; ++d)
      MYRIAD_CHECK(start(d) < n_tokens && (d == 0 ? start(d) == 0 : start(d) > start(d - 1)),
                   "TokenStream: ", path, " has a corrupt document index");
  }
  ~MappedShard() {
    if (base != MAP_FAILED) ::munmap(base, bytes);
  }
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
};

}  // namespace

ShardStats write_token_shards(const std::vector<std::string>& docs, const Tokenizer& tokenizer,
                              const std::string& out_dir, int64_t shard_tokens,
                              double heldout_fraction, uint64_t seed) {
  return write_shards(
      docs.size(), [&](size_t i) { return tokenizer.encode(docs[i]); }, tokenizer.vocab_size(),
      tokenizer.eos(), out_dir, shard_tokens, heldout_fraction, seed);
}

ShardStats write_token_shards(const std::vector<std::vector<int32_t>>& docs, int vocab_size,
                              int eos, const std::string& out_dir, int64_t shard_tokens,
                              double heldout_fraction, uint64_t seed,
                              const std::vector<std::vector<uint8_t>>* weights) {
  return write_shards(
      docs.size(), [&](size_t i) -> const std::vector<int32_t>& { return docs[i]; }, vocab_size,
      eos, out_dir, shard_tokens, heldout_fraction, seed, weights);
}

std::string TokenStream::State::to_json() const {
  return nlohmann::json{{"seed", seed}, {"split", split},   {"epoch", epoch},
                        {"doc", doc},   {"offset", offset}, {"n_docs", n_docs}}
      .dump();
}

TokenStream::State TokenStream::State::from_json(const std::string& json) {
  State s;
  try {
    auto j = nlohmann::json::parse(json);
    s.seed = j.at("seed").get<uint64_t>();
    s.split = j.at("split").get<std::string>();
    s.epoch = j.at("epoch").get<int64_t>();
    s.doc = j.at("doc").get<int64_t>();
    s.offset = j.at("offset").get<int64_t>();
    s.n_docs = j.at("n_docs").get<int64_t>();
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("TokenStream::State::from_json: ", e.what()));
  }
  return s;
}

struct TokenStream::Impl {
  std::vector<std::unique_ptr<MappedShard>> shards;
  struct Doc {
    const int32_t* tokens;
    const uint8_t* weights;  // null: every token weighs 1
    int64_t len;             // including the trailing eos
  };
  std::vector<Doc> docs;
  std::vector<uint32_t> order;  // this epoch's document order
  State st;
  int vocab = 0, eos = 0;
  int64_t total = 0;
  bool weighted = false;  // some shard carries loss weights

  void make_order() {
    order.resize(docs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
    Rng rng(st.seed * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(st.epoch) + 1);
    rng.shuffle(order);
  }
  void advance(int64_t n) {
    while (n > 0) {
      const int64_t left = docs[order[st.doc]].len - st.offset;
      if (n < left) {
        st.offset += n;
        return;
      }
      n -= left;
      st.offset = 0;
      if (++st.doc == static_cast<int64_t>(docs.size())) {
        st.doc = 0;
        ++st.epoch;
        make_order();
      }
    }
  }
};

TokenStream::TokenStream(const std::string& dir, const std::string& split, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  MYRIAD_CHECK(split == "train" || split == "heldout", "TokenStream: split must be 'train' or ",
               "'heldout', got '", split, "'");
  std::ifstream f(dir + "/meta.json");
  MYRIAD_CHECK(f, "TokenStream: ", dir, "/meta.json not found (run `myriad data build`)");
  nlohmann::json meta;
  try {
    meta = nlohmann::json::parse(f);
    impl_->vocab = meta.at("vocab_size").get<int>();
    impl_->eos = meta.at("eos").get<int>();
    for (const auto& name : meta.at(split))
      impl_->shards.push_back(std::make_unique<MappedShard>(dir + "/" + name.get<std::string>(),
                                                            impl_->vocab, impl_->eos));
  } catch (const nlohmann::json::exception& e) {
    throw Error(cat("TokenStream: ", dir, "/meta.json: ", e.what()));
  }
  for (const auto& s : impl_->shards)
    for (uint64_t d = 0; d < s->n_docs; ++d) {
      const uint64_t end = d + 1 < s->n_docs ? s->start(d + 1) : s->n_tokens;
      impl_->docs.push_back({s->tokens + s->start(d),
                             s->weights ? s->weights + s->start(d) : nullptr,
                             static_cast<int64_t>(end - s->start(d))});
      impl_->weighted = impl_->weighted || s->weights;
      impl_->total += impl_->docs.back().len;
    }
  MYRIAD_CHECK(!impl_->docs.empty(), "TokenStream: split '", split, "' in ", dir, " is empty");
  impl_->st = {seed, split, 0, 0, 0, static_cast<int64_t>(impl_->docs.size())};
  impl_->make_order();
}

TokenStream::~TokenStream() = default;
TokenStream::TokenStream(TokenStream&&) noexcept = default;

Batch TokenStream::next(int64_t B, int64_t T, bool align) {
  MYRIAD_CHECK(B > 0 && T > 0, "TokenStream::next: B and T must be positive, got B=", B, " T=", T);
  auto& m = *impl_;
  std::vector<int64_t> in(static_cast<size_t>(B * T)), lab(static_cast<size_t>(B * T));
  std::vector<double> wt(m.weighted ? static_cast<size_t>(B * T) : 0);
  auto weight_here = [&] {  // the loss weight of the token under the cursor
    const Impl::Doc& d = m.docs[m.order[m.st.doc]];
    return d.weights ? static_cast<double>(d.weights[m.st.offset]) : 1.0;
  };
  Batch out;
  out.doc_starts.resize(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    if (align && m.st.offset != 0) m.advance(m.docs[m.order[m.st.doc]].len - m.st.offset);
    // Row b is the next T tokens; its last label is the token the cursor stops on.
    for (int64_t t = 0; t < T; ++t) {
      if (m.st.offset == 0) out.doc_starts[b].push_back(t);
      in[b * T + t] = m.docs[m.order[m.st.doc]].tokens[m.st.offset];
      if (t > 0) lab[b * T + t - 1] = in[b * T + t];
      if (t > 0 && m.weighted) wt[b * T + t - 1] = weight_here();
      m.advance(1);
    }
    lab[b * T + T - 1] = m.docs[m.order[m.st.doc]].tokens[m.st.offset];
    if (m.weighted) wt[b * T + T - 1] = weight_here();
  }
  out.input_ids = Tensor::from_ints(in, {B, T});
  out.labels = Tensor::from_ints(lab, {B, T});
  if (m.weighted) out.loss_weights = Tensor::from_doubles(wt, {B, T});
  return out;
}

TokenStream::State TokenStream::state() const {
  return impl_->st;
}

void TokenStream::restore(const State& s) {
  auto& m = *impl_;
  MYRIAD_CHECK(s.split == m.st.split && s.n_docs == m.st.n_docs, "TokenStream::restore: state is ",
               "for split '", s.split, "' with ", s.n_docs, " documents, this stream is '",
               m.st.split, "' with ", m.st.n_docs);
  MYRIAD_CHECK(s.epoch >= 0 && s.doc >= 0 && s.doc < s.n_docs && s.offset >= 0,
               "TokenStream::restore: invalid state ", s.to_json());
  const bool reorder = s.seed != m.st.seed || s.epoch != m.st.epoch;
  m.st = s;
  if (reorder) m.make_order();
  MYRIAD_CHECK(s.offset < m.docs[m.order[s.doc]].len, "TokenStream::restore: offset ", s.offset,
               " is past the end of its document");
}

int64_t TokenStream::num_docs() const {
  return static_cast<int64_t>(impl_->docs.size());
}
int64_t TokenStream::num_tokens() const {
  return impl_->total;
}
int TokenStream::vocab_size() const {
  return impl_->vocab;
}
int TokenStream::eos() const {
  return impl_->eos;
}

}  // namespace myriad::data
