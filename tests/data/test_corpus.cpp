#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "core/error.h"
#include "data/corpus.h"
#include "tests/data/data_test_util.h"

using namespace myriad::data;

namespace {

// Writes WordNet data lines whose first field is their own byte offset, after a licence header.
std::string write_wordnet_sample(const std::string& dir, const std::vector<std::string>& rest) {
  std::string text =
      "  1 This software and database is provided under a licence.  \n"
      "  2 Header lines begin with two spaces.  \n";
  for (const auto& r : rest) {
    char off[16];
    std::snprintf(off, sizeof off, "%08zu", text.size());
    text += off + r + "  \n";
  }
  const std::string path = dir + "/data.sample";
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

}  // namespace

TEST(WordNet, ParsesSyntheticSample) {
  const auto dir = dtest::scratch_dir("wn");
  const auto path = write_wordnet_sample(
      dir, {" 03 n 02 gizmo 0 small_device 0 001 @ 00001740 n 0000 | a small gadget; \"he "
            "lost the gizmo\"; \"gizmos everywhere\"",
            " 00 a 01 awake(p) 0 000 | not sleeping",
            " 29 v 01 blink 0 001 @ 00000001 v 0000 01 + 02 00 | close the eyes briefly"});
  const auto syn = read_wordnet_data(path);
  ASSERT_EQ(syn.size(), 3u);
  EXPECT_EQ(syn[0].pos, 'n');
  EXPECT_EQ(syn[0].words, (std::vector<std::string>{"gizmo", "small device"}));
  EXPECT_EQ(syn[0].gloss, "a small gadget");
  EXPECT_EQ(syn[0].examples, (std::vector<std::string>{"he lost the gizmo", "gizmos everywhere"}));
  EXPECT_EQ(synset_document(syn[0]),
            "gizmo, small device: a small gadget. Example: he lost the gizmo. Example: gizmos "
            "everywhere.");
  EXPECT_EQ(syn[1].words, std::vector<std::string>{"awake"});  // marker (p) removed
  EXPECT_EQ(synset_document(syn[1]), "awake: not sleeping.");
  EXPECT_EQ(syn[2].pos, 'v');
  EXPECT_EQ(syn[2].gloss, "close the eyes briefly");
}

TEST(WordNet, RejectsMalformedLines) {
  const auto dir = dtest::scratch_dir("wnbad");
  // Wrong offset: the line claims another byte position.
  std::ofstream(dir + "/bad1") << "00000042 03 n 01 thing 0 000 | a thing\n";
  EXPECT_THROW(read_wordnet_data(dir + "/bad1"), myriad::Error);
  // w_cnt says two words, only one is present before p_cnt.
  const auto p2 = write_wordnet_sample(dir, {" 03 n 02 thing 0 000 | a thing"});
  EXPECT_THROW(read_wordnet_data(p2), myriad::Error);
  try {
    wordnet_documents(dir + "/nowhere");
    FAIL() << "expected an error";
  } catch (const myriad::Error& e) {
    EXPECT_NE(std::string(e.what()).find("wordnet-base"), std::string::npos) << e.what();
  }
}

TEST(WordNet, RealPackageCounts) {
  if (!std::filesystem::exists("/usr/share/wordnet/data.noun"))
    GTEST_SKIP() << "wordnet-base is not installed";
  const auto nouns = read_wordnet_data("/usr/share/wordnet/data.noun");
  EXPECT_EQ(nouns.size(), 82115u);  // TRAINING.md §10
  EXPECT_EQ(nouns[0].words, std::vector<std::string>{"entity"});
  size_t total = nouns.size();
  for (const char* pos : {"verb", "adj", "adv"})
    total += read_wordnet_data(std::string("/usr/share/wordnet/data.") + pos).size();
  EXPECT_EQ(total, 117659u);
}

TEST(Gcide, Base64Numerals) {
  EXPECT_EQ(gcide_b64("A"), 0u);
  EXPECT_EQ(gcide_b64("B"), 1u);
  EXPECT_EQ(gcide_b64("a"), 26u);
  EXPECT_EQ(gcide_b64("0"), 52u);
  EXPECT_EQ(gcide_b64("+"), 62u);
  EXPECT_EQ(gcide_b64("/"), 63u);
  EXPECT_EQ(gcide_b64("BA"), 64u);
  EXPECT_EQ(gcide_b64("5I"), 57u * 64 + 8);
  EXPECT_THROW(gcide_b64("A-B"), myriad::Error);
  EXPECT_THROW(gcide_b64(""), myriad::Error);
}

TEST(Gcide, RealPackageSequentialRead) {
  if (!std::filesystem::exists("/usr/share/dictd/gcide.index"))
    GTEST_SKIP() << "dict-gcide is not installed";
  const auto docs = gcide_documents("/usr/share/dictd", 500);
  ASSERT_EQ(docs.size(), 500u);
  for (const auto& d : docs) {
    EXPECT_FALSE(d.empty());
    EXPECT_EQ(d.find("00-database"), std::string::npos);
    EXPECT_EQ(d.find('\n'), std::string::npos);
    EXPECT_EQ(d.find('<'), std::string::npos) << d.substr(0, 200);
    EXPECT_EQ(d.find("[1913 Webster]"), std::string::npos) << d.substr(0, 200);
  }
  // The first entries of the file are the numerals ("1", "10", ...) and the first is not empty
  // of words.
  EXPECT_NE(docs[0].find(' '), std::string::npos);
}

TEST(Corpus, SyntheticFallbackIsDeterministic) {
  const auto a = synthetic_fallback_corpus(3, 5000), b = synthetic_fallback_corpus(3, 5000);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, synthetic_fallback_corpus(4, 5000));
  size_t bytes = 0;
  for (const auto& d : a) bytes += d.size();
  EXPECT_GE(bytes, 5000u);
}

TEST(Corpus, BuiltinCorpusIsDeterministicAndMixed) {
  if (!std::filesystem::exists("/usr/share/wordnet/data.noun") ||
      !std::filesystem::exists("/usr/share/dictd/gcide.index"))
    GTEST_SKIP() << "wordnet-base or dict-gcide is not installed";
  const auto a = builtin_corpus(200000);
  size_t bytes = 0, wordnet_like = 0;
  for (const auto& d : a) {
    bytes += d.size();
    wordnet_like += d.find(": ") != std::string::npos && d.find(": ") < 60;
  }
  EXPECT_GE(bytes, 200000u);
  EXPECT_LT(bytes - a.back().size(), 200000u);  // stops at the first document over the budget
  EXPECT_GT(wordnet_like, a.size() / 10);       // both sources are present
  EXPECT_LT(wordnet_like, a.size());
  EXPECT_EQ(a, builtin_corpus(200000));
}
