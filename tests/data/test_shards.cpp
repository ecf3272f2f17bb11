#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "core/error.h"
#include "data/shards.h"
#include "tests/data/data_test_util.h"

using namespace myriad::data;
using Doc = std::vector<int32_t>;

namespace {

constexpr int kVocab = 200, kEos = 2;

// Distinct documents of 1..40 tokens in [4, kVocab), no eos inside.
std::vector<Doc> make_docs(int n) {
  std::vector<Doc> docs;
  Rng rng(5);
  for (int i = 0; i < n; ++i) {
    Doc d{4 + i % 150, 4 + i / 150};
    const auto len = rng.below(39);
    for (uint64_t k = 0; k < len; ++k) d.push_back(4 + static_cast<int32_t>(rng.below(kVocab - 4)));
    docs.push_back(d);
  }
  return docs;
}

std::vector<int64_t> row(const myriad::Tensor& t) {
  const int64_t* p = t.data<int64_t>();
  return {p, p + t.numel()};
}

// Reads n tokens (rows of 1) and splits them at eos into documents.
std::vector<Doc> read_docs(TokenStream& s, int64_t n) {
  auto b = s.next(1, n);
  std::vector<Doc> out(1);
  for (int64_t v : row(b.input_ids)) {
    if (v == kEos) {
      out.emplace_back();
    } else {
      out.back().push_back(static_cast<int32_t>(v));
    }
  }
  out.pop_back();  // empty tail after the last eos
  return out;
}

}  // namespace

TEST(Shards, RoundTripSplitsAndBoundaries) {
  const auto dir = dtest::scratch_dir("shards");
  const auto docs = make_docs(300);
  const auto st = write_token_shards(docs, kVocab, kEos, dir, 500, 0.1, 42);
  EXPECT_EQ(st.train_docs + st.heldout_docs, 300);
  EXPECT_EQ(st.heldout_docs, 30);
  EXPECT_GT(st.train_shards, 3);  // documents never straddle, so many shards of <= 500 tokens
  TokenStream train(dir, "train", 1), held(dir, "heldout", 1);
  EXPECT_EQ(train.num_docs(), st.train_docs);
  EXPECT_EQ(train.num_tokens(), st.train_tokens);
  auto got_train = read_docs(train, train.num_tokens());
  auto got_held = read_docs(held, held.num_tokens());
  ASSERT_EQ(static_cast<int64_t>(got_train.size()), st.train_docs);
  ASSERT_EQ(static_cast<int64_t>(got_held.size()), st.heldout_docs);
  // Held-out and train are disjoint and together are exactly the input documents.
  std::set<Doc> a(got_train.begin(), got_train.end()), b(got_held.begin(), got_held.end());
  for (const auto& d : b) EXPECT_FALSE(a.count(d));
  std::set<Doc> all(a);
  all.insert(b.begin(), b.end());
  EXPECT_EQ(all, std::set<Doc>(docs.begin(), docs.end()));
  // The order is shuffled, not the file order.
  std::vector<Doc> in_order;
  for (const auto& d : docs)
    if (a.count(d)) in_order.push_back(d);
  EXPECT_NE(got_train, in_order);
}

TEST(Shards, BatchesLabelsAndDocStarts) {
  const auto dir = dtest::scratch_dir("batches");
  write_token_shards(make_docs(100), kVocab, kEos, dir, 400, 0.0, 3);
  TokenStream s(dir, "train", 9);
  const int64_t B = 4, T = 37;
  auto b1 = s.next(B, T), b2 = s.next(B, T);
  ASSERT_EQ(b1.input_ids.shape(), (myriad::Shape{B, T}));
  ASSERT_EQ(b1.labels.shape(), (myriad::Shape{B, T}));
  auto in = row(b1.input_ids), lab = row(b1.labels), in2 = row(b2.input_ids);
  for (int64_t i = 0; i + 1 < B * T; ++i) EXPECT_EQ(lab[i], in[i + 1]);  // rows are contiguous
  EXPECT_EQ(lab[B * T - 1], in2[0]);
  for (int64_t r = 0; r < B; ++r) {
    std::vector<int64_t> want;
    for (int64_t t = 0; t < T; ++t) {
      const bool after_eos = t > 0 ? in[r * T + t - 1] == kEos
                                   : (r > 0 ? in[r * T - 1] == kEos : true);  // stream starts a doc
      if (after_eos) want.push_back(t);
    }
    EXPECT_EQ(b1.doc_starts[r], want) << "row " << r;
  }
}

// Aligned rows start at a document start and hold every document of up to T tokens whole; they
// are the unaligned stream with the cut-off document tails left out.
TEST(Shards, AlignedRowsStartAtDocuments) {
  const auto dir = dtest::scratch_dir("aligned");
  const auto docs = make_docs(60);  // 3..41 tokens with the eos
  write_token_shards(docs, kVocab, kEos, dir, 400, 0.0, 3);
  TokenStream s(dir, "train", 4);
  const std::set<Doc> all(docs.begin(), docs.end());
  const int64_t B = 5, T = 48;
  int whole = 0;
  for (int step = 0; step < 6; ++step) {
    const auto b = s.next(B, T, /*align=*/true);
    const auto in = row(b.input_ids);
    for (int64_t r = 0; r < B; ++r) {
      ASSERT_FALSE(b.doc_starts[r].empty());
      EXPECT_EQ(b.doc_starts[r][0], 0) << "row " << r;
      // The row's first document ends with an eos inside the row and is an input document.
      Doc first;
      int64_t t = 0;
      for (; t < T && in[r * T + t] != kEos; ++t)
        first.push_back(static_cast<int32_t>(in[r * T + t]));
      ASSERT_LT(t, T) << "a document of at most 41 tokens fits a row of 48";
      EXPECT_TRUE(all.count(first));
      ++whole;
    }
  }
  EXPECT_EQ(whole, 30);
}

// Per-token loss weights travel with their tokens: each label's weight is its token's, the eos
// after a document weighs 1, documents without weights weigh 1, and a flipped weight byte is a
// checksum error. Shards written without weights give batches without them.
TEST(Shards, LossWeightsFollowTheirTokens) {
  const auto dir = dtest::scratch_dir("weights");
  const auto docs = make_docs(80);
  std::vector<std::vector<uint8_t>> weights(docs.size());
  for (size_t i = 0; i < docs.size(); ++i)
    if (i % 3 != 0)  // every third document unweighted
      for (int32_t t : docs[i]) weights[i].push_back(static_cast<uint8_t>(t % 7));
  write_token_shards(docs, kVocab, kEos, dir, 300, 0.0, 3, &weights);
  TokenStream s(dir, "train", 5);
  int64_t weighted = 0;
  for (int step = 0; step < 5; ++step) {
    const auto b = s.next(3, 41, step % 2 == 1);
    ASSERT_TRUE(b.loss_weights.defined());
    ASSERT_EQ(b.loss_weights.shape(), (myriad::Shape{3, 41}));
    const auto lab = row(b.labels);
    const auto w = b.loss_weights.to_doubles();
    for (size_t i = 0; i < lab.size(); ++i) {
      // Weighted documents' tokens weigh token % 7, others 1; eos always 1.
      if (lab[i] == kEos || w[i] == 1.0) continue;
      EXPECT_EQ(w[i], static_cast<double>(lab[i] % 7)) << i;
      ++weighted;
    }
  }
  EXPECT_GT(weighted, 100);
  // Without weights (or with only empty lists): no loss_weights.
  const auto plain = dtest::scratch_dir("weights-none");
  const std::vector<std::vector<uint8_t>> none(docs.size());
  write_token_shards(docs, kVocab, kEos, plain, 300, 0.0, 3, &none);
  EXPECT_FALSE(TokenStream(plain, "train", 5).next(2, 16).loss_weights.defined());
  // A weight list of the wrong length is refused; a corrupted weight byte fails the checksum.
  weights[1].pop_back();
  EXPECT_THROW(write_token_shards(docs, kVocab, kEos, dtest::scratch_dir("weights-bad"), 300, 0.0,
                                  3, &weights),
               myriad::Error);
  const auto shard = dir + "/train_00000.bin";
  const auto size = std::filesystem::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(size - 1));
    f.put('\x7f');
  }
  try {
    TokenStream bad(dir, "train", 0);
    FAIL() << "corrupt weights accepted";
  } catch (const myriad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
}

TEST(Shards, DeterministicShuffleAndExactResume) {
  const auto dir = dtest::scratch_dir("resume");
  write_token_shards(make_docs(40), kVocab, kEos, dir, 300, 0.0, 3);
  TokenStream a(dir, "train", 5), b(dir, "train", 5), c(dir, "train", 6);
  const auto first = row(a.next(2, 64).input_ids);
  EXPECT_EQ(first, row(b.next(2, 64).input_ids));
  EXPECT_NE(first, row(c.next(2, 64).input_ids));
  // Run past several epochs (40 docs of ~20 tokens), saving a state mid-way.
  for (int i = 0; i < 7; ++i) a.next(3, 50);
  const std::string saved = a.state().to_json();
  std::vector<std::vector<int64_t>> expect;
  for (int i = 0; i < 12; ++i) {
    auto bt = a.next(3, 50);
    expect.push_back(row(bt.input_ids));
    expect.push_back(row(bt.labels));
  }
  EXPECT_GT(a.state().epoch, 1);
  TokenStream r(dir, "train", 123);  // the seed comes from the state
  r.restore(TokenStream::State::from_json(saved));
  for (int i = 0; i < 12; ++i) {
    auto bt = r.next(3, 50);
    EXPECT_EQ(row(bt.input_ids), expect[2 * i]) << i;
    EXPECT_EQ(row(bt.labels), expect[2 * i + 1]) << i;
  }
  auto bad = TokenStream::State::from_json(saved);
  bad.split = "heldout";
  EXPECT_THROW(r.restore(bad), myriad::Error);
  EXPECT_THROW(TokenStream::State::from_json("{\"seed\": 1}"), myriad::Error);
}

TEST(Shards, TruncatedOrCorruptShardIsRefused) {
  const auto dir = dtest::scratch_dir("corrupt");
  write_token_shards(make_docs(50), kVocab, kEos, dir, 100000, 0.0, 3);
  const auto shard = dir + "/train_00000.bin";
  const auto size = std::filesystem::file_size(shard);
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  try {
    TokenStream s(dir, "train", 0);
    FAIL() << "corrupt shard accepted";
  } catch (const myriad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("checksum"), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(shard, size - 4);
  try {
    TokenStream s(dir, "train", 0);
    FAIL() << "truncated shard accepted";
  } catch (const myriad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("truncated"), std::string::npos) << e.what();
  }
  std::filesystem::resize_file(shard, 10);
  EXPECT_THROW(TokenStream(dir, "train", 0), myriad::Error);
  EXPECT_THROW(TokenStream(dir + "/none", "train", 0), myriad::Error);
}

TEST(Shards, TextDocumentsThroughTokenizer) {
  const auto& tok = dtest::test_tokenizer();
  const auto dir = dtest::scratch_dir("text");
  const std::vector<std::string> docs = {"The river runs slowly.", "A cat slept.",
                                         "The pass key is 12345."};
  write_token_shards(docs, tok, dir, 1 << 20, 0.0, 1);
  TokenStream s(dir, "train", 0);
  EXPECT_EQ(s.vocab_size(), tok.vocab_size());
  int64_t n = 0;
  for (const auto& d : docs) n += static_cast<int64_t>(tok.encode(d).size()) + 1;
  EXPECT_EQ(s.num_tokens(), n);
  std::vector<int32_t> ids;
  for (int64_t v : row(s.next(1, n).input_ids))
    if (v != tok.eos()) ids.push_back(static_cast<int32_t>(v));
  const auto text = tok.decode(ids);
  for (const auto& d : docs) EXPECT_NE(text.find(d), std::string::npos) << text;
}
