#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <set>

#include "core/error.h"
#include "data/synthetic.h"
#include "tests/data/data_test_util.h"

using namespace myriad::data;

TEST(Synthetic, PasskeyNeedleDepthAndAnswer) {
  const auto& tok = dtest::test_tokenizer();
  const auto filler = Filler::fixed();
  const int64_t L = 600;
  for (double depth : {0.0, 0.25, 0.5, 0.75, 1.0}) {
    const auto it = passkey(17, L, depth, tok, filler);
    EXPECT_EQ(it.task, "passkey");
    ASSERT_TRUE(std::regex_match(it.answer, std::regex("[1-9][0-9]{4}"))) << it.answer;
    const std::string needle =
        "The pass key is " + it.answer + ". Remember it. " + it.answer + " is the pass key.";
    const size_t at = it.prompt.find(needle);
    ASSERT_NE(at, std::string::npos) << it.prompt;
    EXPECT_EQ(it.prompt.find(needle, at + 1), std::string::npos);  // exactly once
    EXPECT_TRUE(it.prompt.ends_with("What is the pass key? The pass key is"));
    EXPECT_EQ(it.tokens, tok.encode(it.prompt));
    EXPECT_LE(static_cast<int64_t>(it.tokens.size()), L + 8);
    EXPECT_GE(static_cast<int64_t>(it.tokens.size()), L * 9 / 10);
    ASSERT_EQ(it.depths.size(), 1u);
    EXPECT_NEAR(it.depths[0], depth, 0.05);
    // The needle sits at the requested depth of the filler, measured in tokens.
    auto count = [&](const std::string& s) { return static_cast<double>(tok.encode(s).size()); };
    const size_t intro_end = it.prompt.find("I will quiz you about it.") + 25;
    const double intro = count(it.prompt.substr(0, intro_end));
    const double filler_tokens = static_cast<double>(it.tokens.size()) - intro - count(needle) -
                                 count("What is the pass key? The pass key is");
    const double before = count(it.prompt.substr(0, at)) - intro;
    EXPECT_NEAR(before / filler_tokens, depth, 0.05) << "depth " << depth;
  }
  EXPECT_EQ(passkey(17, L, 0.5, tok, filler).prompt, passkey(17, L, 0.5, tok, filler).prompt);
  EXPECT_NE(passkey(17, L, 0.5, tok, filler).answer, passkey(18, L, 0.5, tok, filler).answer);
  EXPECT_THROW(passkey(1, L, 1.5, tok, filler), myriad::Error);
}

TEST(Synthetic, MultiKeyNeedles) {
  const auto& tok = dtest::test_tokenizer();
  const auto it = mk_niah(3, 4, 800, tok, Filler::fixed());
  std::smatch m;
  std::string rest = it.prompt;
  int needles = 0;
  bool answer_found = false;
  const std::regex re("One of the special magic numbers for ([a-z]+) is: ([0-9]{7})\\.");
  const std::string asked =
      std::regex_search(it.prompt, m, std::regex("magic number for ([a-z]+) mentioned"))
          ? m[1].str()
          : "";
  ASSERT_FALSE(asked.empty());
  while (std::regex_search(rest, m, re)) {
    ++needles;
    if (m[1] == asked) answer_found = m[2] == it.answer;
    rest = m.suffix();
  }
  EXPECT_EQ(needles, 4);
  EXPECT_TRUE(answer_found) << it.prompt;
}

TEST(Synthetic, VariableTrackingChains) {
  const auto& tok = dtest::test_tokenizer();
  const auto it = variable_tracking(5, 2, 700, tok, Filler::fixed());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(it.prompt, m, std::regex("assigned the value ([0-9]{5}) in")));
  const std::string value = m[1];
  std::vector<std::string> names;
  for (size_t a = 0, b; a <= it.answer.size(); a = b + 1) {
    b = std::min(it.answer.find(' ', a), it.answer.size());
    names.push_back(it.answer.substr(a, b - a));
  }
  ASSERT_EQ(names.size(), 3u);  // 2 hops: 3 variables
  // The chain appears in order: VAR A = value, VAR B = A, VAR C = B.
  size_t pos = it.prompt.find("VAR " + names[0] + " = " + value + ".");
  ASSERT_NE(pos, std::string::npos);
  for (size_t i = 1; i < names.size(); ++i) {
    const size_t p = it.prompt.find("VAR " + names[i] + " = " + names[i - 1] + ".");
    ASSERT_NE(p, std::string::npos);
    EXPECT_GT(p, pos);
    pos = p;
  }
  // Two distractor chains of three statements each.
  int statements = 0;
  for (size_t p = 0; (p = it.prompt.find("VAR ", p)) != std::string::npos; ++p) ++statements;
  EXPECT_EQ(statements, 9);
}

TEST(Synthetic, AssociativeRecall) {
  const auto& tok = dtest::test_tokenizer();
  const auto it = mqar(8, 8, 600, tok, Filler::fixed());
  std::smatch m;
  ASSERT_TRUE(std::regex_search(it.prompt, m, std::regex("Which value does key ([a-z]{4}) map")));
  const std::string key = m[1];
  EXPECT_NE(it.prompt.find("Key " + key + " maps to " + it.answer + "."), std::string::npos);
  EXPECT_TRUE(it.prompt.ends_with("Key " + key + " maps to"));
  int pairs = 0;
  for (size_t p = 0; (p = it.prompt.find(" maps to ", p)) != std::string::npos; ++p) ++pairs;
  EXPECT_EQ(pairs, 8 + 1);  // the pairs and the instruction line
  EXPECT_EQ(it.depths.size(), 8u);
  EXPECT_TRUE(it.followup.empty());
  // Training form: 4 queries, the asked one and 3 other distinct keys, each with its own value.
  const auto four = mqar(8, 8, 600, tok, Filler::fixed(), 4);
  EXPECT_EQ(four.prompt, it.prompt);
  std::set<std::string> asked{key};
  const std::regex question("Key ([a-z]{4}) maps to");
  for (const auto& [q, v] : four.followup) {
    ASSERT_TRUE(std::regex_match(q, m, question)) << q;
    const std::string k = m[1];
    EXPECT_NE(four.prompt.find("Key " + k + " maps to " + v + "."), std::string::npos) << k;
    asked.insert(k);
  }
  EXPECT_EQ(asked.size(), 4u);
  EXPECT_THROW(mqar(8, 8, 600, tok, Filler::fixed(), 9), myriad::Error);
}

TEST(Synthetic, LongContextMixShares) {
  const auto& tok = dtest::test_tokenizer();
  const auto source = synthetic_fallback_corpus(9, 30000);
  const auto mix = mix_long_context(1, source, 512, 128, 20000, tok, Filler::fixed(), 0.2);
  const double total =
      static_cast<double>(mix.long_tokens + mix.short_tokens + mix.synthetic_tokens);
  EXPECT_GE(total, 20000);
  EXPECT_NEAR(mix.synthetic_tokens / total, 0.2, 0.05);
  EXPECT_NEAR(mix.short_tokens / total, 0.25, 0.05);
  for (const auto& d : mix.docs) EXPECT_LE(static_cast<int64_t>(d.size()), 512);
  EXPECT_EQ(mix.weights.size(), mix.docs.size());
  for (const auto& w : mix.weights) EXPECT_TRUE(w.empty());  // answer_weight 1: unweighted
  EXPECT_EQ(mix.docs, mix_long_context(1, source, 512, 128, 20000, tok, Filler::fixed(), 0.2).docs);
  // A retrieval-heavy mix (text still the majority) keeps its shares; past 0.45 is an error.
  const auto heavy = mix_long_context(2, source, 256, 64, 20000, tok, Filler::fixed(), 0.45);
  const double n =
      static_cast<double>(heavy.long_tokens + heavy.short_tokens + heavy.synthetic_tokens);
  EXPECT_NEAR(heavy.synthetic_tokens / n, 0.45, 0.05);
  for (const auto& d : heavy.docs) EXPECT_LE(static_cast<int64_t>(d.size()), 256);
  EXPECT_THROW(mix_long_context(2, source, 256, 64, 20000, tok, Filler::fixed(), 0.5),
               myriad::Error);
}

// answer_weight > 1: the weighted tokens of each retrieval item are exactly its answers (the
// asked value and every follow-up value), text documents stay unweighted, and the tokens are the
// same as without weights.
TEST(Synthetic, LongContextMixWeightsTheAnswers) {
  const auto& tok = dtest::test_tokenizer();
  const auto source = synthetic_fallback_corpus(9, 30000);
  const auto mix = mix_long_context(3, source, 512, 128, 20000, tok, Filler::fixed(), 0.45, 8);
  EXPECT_EQ(mix.docs,
            mix_long_context(3, source, 512, 128, 20000, tok, Filler::fixed(), 0.45).docs);
  ASSERT_EQ(mix.weights.size(), mix.docs.size());
  int items = 0, mqar_items = 0;
  for (size_t i = 0; i < mix.docs.size(); ++i) {
    const auto& w = mix.weights[i];
    if (w.empty()) continue;  // a text document
    ++items;
    ASSERT_EQ(w.size(), mix.docs[i].size());
    // Runs of weight-8 tokens, each decoding to a number (passkey, MK-NIAH, MQAR) or variable
    // names (VT); everything else weighs 1.
    std::vector<std::string> answers;
    for (size_t t = 0; t < w.size();) {
      ASSERT_TRUE(w[t] == 1 || w[t] == 8) << int(w[t]);
      if (w[t] == 1) {
        ++t;
        continue;
      }
      std::vector<int32_t> run;
      for (; t < w.size() && w[t] == 8; ++t) run.push_back(mix.docs[i][t]);
      answers.push_back(tok.decode(run));
    }
    ASSERT_GE(answers.size(), 1u);
    const std::string text = tok.decode(mix.docs[i]);
    for (const auto& a : answers) {
      EXPECT_TRUE(std::regex_match(a, std::regex(" ?([0-9]+|([A-Z]{5} ?)+)"))) << a;
      EXPECT_NE(text.find(a + "."), std::string::npos) << a;
    }
    if (text.find("Which value does key") != std::string::npos) {
      ++mqar_items;
      EXPECT_GE(answers.size(), 2u) << text;  // the asked key and follow-ups
    }
  }
  EXPECT_GT(items, 5);
  EXPECT_GT(mqar_items, 0);
  EXPECT_THROW(mix_long_context(3, source, 512, 128, 20000, tok, Filler::fixed(), 0.45, 0),
               myriad::Error);
}

TEST(Synthetic, WordNetFillerHalvesAreDisjoint) {
  if (!std::filesystem::exists("/usr/share/wordnet/data.noun"))
    GTEST_SKIP() << "wordnet-base is not installed";
  const auto train = Filler::wordnet(false, 3000), eval = Filler::wordnet(true, 3000);
  ASSERT_EQ(train.sentences.size(), 3000u);
  ASSERT_EQ(eval.sentences.size(), 3000u);
  std::set<std::string> a(train.sentences.begin(), train.sentences.end());
  int shared = 0;
  for (const auto& s : eval.sentences) shared += a.count(s);
  EXPECT_LT(shared, 30);  // distinct synsets; a few glosses repeat verbatim in WordNet
  EXPECT_TRUE(train.sentences[0].ends_with("."));
}
