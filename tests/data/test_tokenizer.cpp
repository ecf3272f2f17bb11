#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "core/error.h"
#include "data/tokenizer.h"
#include "tests/data/data_test_util.h"

using namespace myriad::data;

namespace {
std::string file_bytes(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}
}  // namespace

TEST(Tokenizer, RoundTripAndSpecials) {
  const auto& tok = dtest::test_tokenizer();
  EXPECT_GT(tok.vocab_size(), 300);
  EXPECT_LE(tok.vocab_size(), 512);
  EXPECT_EQ(tok.bos(), 1);
  EXPECT_EQ(tok.eos(), 2);
  EXPECT_EQ(tok.pad(), 3);
  EXPECT_EQ(tok.unk(), 0);
  EXPECT_EQ(tok.kind(), "sentencepiece");
  for (std::string s :
       {"The farmer watches the green field.", "The pass key is 48213.",
        "naïve café — 日本語 🙂", "two  spaces\nand a newline\ttab", "x"}) {
    const auto ids = tok.encode(s);
    for (int id : ids) EXPECT_NE(id, tok.unk()) << s;  // byte fallback: nothing is unknown
    EXPECT_EQ(tok.decode(ids), s);
  }
  // Digits are split, so every 5-digit number is 5 digit pieces after the space.
  EXPECT_EQ(tok.encode("12345").size(), tok.encode("99999").size());
  EXPECT_THROW(tok.decode({tok.vocab_size()}), myriad::Error);
  // The chat markers are control tokens 4..8: only trusted text yields them.
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(tok.encode_parts({{kChatMarkers[i], true}}), std::vector<int32_t>{4 + i});
    EXPECT_TRUE(tok.is_special(4 + i));
    for (int32_t id : tok.encode(kChatMarkers[i])) EXPECT_FALSE(tok.is_special(id));
  }
}

TEST(Tokenizer, TrainingIsDeterministicAndLoads) {
  const auto dir = dtest::scratch_dir("tokdet");
  const auto docs = synthetic_fallback_corpus(11, 40000);
  auto a = Tokenizer::train(docs, 400, dir + "/a.model");
  auto b = Tokenizer::train(docs, 400, dir + "/b.model");
  const auto bytes = file_bytes(dir + "/a.model");
  EXPECT_FALSE(bytes.empty());
  EXPECT_EQ(bytes, file_bytes(dir + "/b.model"));
  auto c = Tokenizer::load(dir + "/a.model");
  const std::string s = "Our teacher counts seven stones near the bridge.";
  EXPECT_EQ(a.encode(s), c.encode(s));
  EXPECT_EQ(b.encode(s), c.encode(s));
  EXPECT_EQ(c.vocab_size(), a.vocab_size());
  EXPECT_THROW(Tokenizer::load(dir + "/missing.model"), myriad::Error);
  EXPECT_THROW(Tokenizer::train(docs, 100, dir + "/small.model"), myriad::Error);
}
