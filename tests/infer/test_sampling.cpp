// The sampler on hand-made logits (penalties, temperature 0, top-k / top-p / min-p sets, seeds,
// logprobs) and the text stream's stop sequences (spanning tokens, held-back prefixes, UTF-8).
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "infer/sampling.h"
#include "tests/data/data_test_util.h"

namespace myriad::infer {
namespace {

SamplingParams params(double temperature) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

// Draws many times and returns the set of picks.
std::set<int32_t> picks(const SamplingParams& p, const std::vector<float>& logits, int n = 3000) {
  std::set<int32_t> out;
  for (int i = 0; i < n; ++i) out.insert(Sampler(p, {}, 1000 + i).sample(logits).token);
  return out;
}

const std::vector<float> kLogits = {1.0f, 3.0f, 2.0f, 0.5f, 2.9f, -1.0f};
// softmax: p ≈ {.054, .400, .147, .033, .362, .007}; order 1, 4, 2, 0, 3, 5

TEST(Sampling, TemperatureZeroIsGreedy) {
  for (int seed = 0; seed < 20; ++seed)
    EXPECT_EQ(Sampler(params(0), {}, seed).sample(kLogits).token, 1);
}

TEST(Sampling, SeedDeterminism) {
  SamplingParams p = params(2.0);
  Sampler a(p, {}, 99), b(p, {}, 99), c(p, {}, 100);
  std::vector<int32_t> ta, tb, tc;
  for (int i = 0; i < 60; ++i)
    ta.push_back(a.sample(kLogits).token), tb.push_back(b.sample(kLogits).token),
        tc.push_back(c.sample(kLogits).token);
  EXPECT_EQ(ta, tb);
  EXPECT_NE(ta, tc);
}

TEST(Sampling, TopKTopPMinPStayInTheAllowedSet) {
  SamplingParams p = params(1.0);
  p.top_k = 2;
  EXPECT_EQ(picks(p, kLogits), (std::set<int32_t>{1, 4}));
  p = params(1.0);
  p.top_p = 0.7;  // .400 + .362 = .762 >= .7: {1, 4}
  EXPECT_EQ(picks(p, kLogits), (std::set<int32_t>{1, 4}));
  p.top_p = 0.8;  // + .147: {1, 4, 2}
  EXPECT_EQ(picks(p, kLogits), (std::set<int32_t>{1, 2, 4}));
  p = params(1.0);
  p.min_p = 0.3;  // p >= .3 · .400 = .12: {1, 4, 2}
  EXPECT_EQ(picks(p, kLogits), (std::set<int32_t>{1, 2, 4}));
  p.min_p = 0.5;
  EXPECT_EQ(picks(p, kLogits), (std::set<int32_t>{1, 4}));
  // No filter: every token eventually.
  EXPECT_EQ(picks(params(3.0), kLogits).size(), kLogits.size());
  // The probabilities of the kept ones are renormalised.
  p = params(1.0);
  p.top_k = 2;
  std::vector<double> l(kLogits.begin(), kLogits.end());
  auto pr = sampling_probs(l, p);
  EXPECT_NEAR(pr[1] + pr[4], 1.0, 1e-12);
  EXPECT_NEAR(pr[1] / pr[4], std::exp(double(3.0f) - double(2.9f)), 1e-12);
  EXPECT_EQ(pr[0], 0.0);
}

TEST(Sampling, PenaltiesChangeLogitsAsSpecified) {
  std::vector<double> l = {2.0, -2.0, 1.0, 0.5};
  SamplingParams p;
  p.repetition_penalty = 2.0, p.presence_penalty = 0.5, p.frequency_penalty = 0.25;
  apply_penalties(l, p, {0, 1}, {{0, 2}, {2, 1}});
  EXPECT_DOUBLE_EQ(l[0], 2.0 / 2 - 0.5 - 0.25 * 2);  // seen + generated twice
  EXPECT_DOUBLE_EQ(l[1], -2.0 * 2);                  // seen (prompt) only
  EXPECT_DOUBLE_EQ(l[2], 1.0 - 0.5 - 0.25);          // generated once, not seen by rep
  EXPECT_DOUBLE_EQ(l[3], 0.5);
  // Through the sampler: a greedy pick is penalised next time.
  SamplingParams g = params(0);
  g.presence_penalty = 10;
  Sampler s(g, {}, 1);
  EXPECT_EQ(s.sample(kLogits).token, 1);
  EXPECT_EQ(s.sample(kLogits).token, 4);
  // Repetition penalty covers the prompt.
  SamplingParams r = params(0);
  r.repetition_penalty = 1.5;
  EXPECT_EQ(Sampler(r, std::vector<int32_t>{1}, 1).sample(kLogits).token, 4);
}

TEST(Sampling, LogprobsAreLogSoftmaxAndAlternativesSorted) {
  SamplingParams p = params(0);
  p.top_logprobs = 4;
  Pick pk = Sampler(p, {}, 1).sample(kLogits);
  const auto lp = log_softmax(kLogits);
  double z = 0;
  for (double v : lp) z += std::exp(v);
  EXPECT_NEAR(z, 1.0, 1e-12);
  EXPECT_NEAR(lp[1] - lp[2], 1.0, 1e-12);
  EXPECT_DOUBLE_EQ(pk.logprob, lp[1]);
  ASSERT_EQ(pk.top.size(), 4u);
  const int32_t want[] = {1, 4, 2, 0};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(pk.top[i].first, want[i]);
    EXPECT_DOUBLE_EQ(pk.top[i].second, lp[want[i]]);
  }
  p.top_logprobs = 0;
  EXPECT_TRUE(Sampler(p, {}, 1).sample(kLogits).top.empty());
}

TEST(Sampling, InvalidParamsThrow) {
  SamplingParams p;
  p.top_k = -1;
  EXPECT_THROW(validate_sampling(p), std::invalid_argument);
  p = {};
  p.min_p = 2;
  EXPECT_THROW(validate_sampling(p), std::invalid_argument);
  p = {};
  p.top_logprobs = 21;
  EXPECT_THROW(validate_sampling(p), std::invalid_argument);
  p = {};
  p.repetition_penalty = 0;
  EXPECT_THROW(validate_sampling(p), std::invalid_argument);
  EXPECT_NO_THROW(validate_sampling(SamplingParams{}));
}

// Token k decodes to pieces[k]; text = concatenation.
TextStream stream(std::vector<std::string> stop, std::vector<std::string> pieces) {
  return TextStream(std::move(stop), [pieces](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += pieces[t];
    return s;
  });
}

TEST(TextStream, StopSpanningTokensIsCutAndNeverStreamed) {
  const std::vector<std::string> pieces = {"Hel", "lo", " wo", "rld", "!", " w"};
  auto ts = stream({"o wor"}, pieces);
  std::string out;
  auto a = ts.push(0);  // "Hel"
  EXPECT_EQ(a.text, "Hel");
  auto b = ts.push(1);  // "Hello": "o" may begin the stop
  EXPECT_EQ(b.text, "l");
  auto c = ts.push(2);  // "Hello wo": "o wo" held
  EXPECT_EQ(c.text, "");
  auto d = ts.push(3);  // "Hello world": stop completes
  EXPECT_TRUE(d.stopped);
  EXPECT_EQ(a.text + b.text + c.text + d.text, "Hell");
  EXPECT_EQ(ts.text(), "Hell");
}

TEST(TextStream, HeldPrefixIsReleasedWhenTheStopDoesNotComplete) {
  auto ts = stream({"o wor", "XYZ"}, {"Hello", " wo", "w!", "X"});
  std::string out = ts.push(0).text;  // "Hello": "o" held
  EXPECT_EQ(out, "Hell");
  out += ts.push(1).text;  // "Hello wo" held from "o wo"
  EXPECT_EQ(out, "Hell");
  auto s = ts.push(2);  // "Hello wow!": no stop can complete any more
  EXPECT_FALSE(s.stopped);
  out += s.text;
  EXPECT_EQ(out, "Hello wow!");
  out += ts.push(3).text;  // "X" may begin "XYZ"
  EXPECT_EQ(out, "Hello wow!");
  out += ts.flush();  // the end: released
  EXPECT_EQ(out, "Hello wow!X");
}

TEST(TextStream, EarliestStopWinsAndIncompleteUtf8IsHeld) {
  auto ts = stream({"cd", "b"}, {"ab", "cd"});
  auto s = ts.push(0);
  EXPECT_TRUE(s.stopped);
  EXPECT_EQ(s.text, "a");
  // "é" = C3 A9 split over two tokens: nothing released until it is complete.
  auto u = stream({}, {"x\xC3", "\xA9y", "\xEF\xBF\xBD"});
  EXPECT_EQ(u.push(0).text, "x");
  EXPECT_EQ(u.push(1).text, "\xC3\xA9y");
  EXPECT_EQ(u.push(2).text, "");  // U+FFFD may still turn into a character
  EXPECT_EQ(u.flush(), "\xEF\xBF\xBD");
}

// The incremental detokenisation releases exactly what decoding everything gives: with a
// leading-space rule like SentencePiece's, and with the real tokenizer on multi-byte text.
TEST(TextStream, IncrementalDecodeEqualsFullDecode) {
  const std::vector<std::string> pieces = {" Hello", " world", "!", " \xC3", "\xA9", " x"};
  auto dec = [pieces](const std::vector<int32_t>& ids) {
    std::string s;
    for (int32_t t : ids) s += pieces[t];
    return s.empty() || s[0] != ' ' ? s : s.substr(1);
  };
  TextStream ts({}, dec);
  const std::vector<int32_t> ids = {0, 1, 2, 3, 4, 5, 1};
  std::string out;
  for (int32_t t : ids) out += ts.push(t).text;
  out += ts.flush();
  EXPECT_EQ(out, dec(ids));

  const data::Tokenizer& tok = data::dtest::test_tokenizer();
  const std::string text = "The naïve café — 東京 and ünïcödé, twice: naïve café!";
  const std::vector<int32_t> all = tok.encode(text);
  TextStream real({}, [&](const std::vector<int32_t>& v) { return tok.decode(v); });
  std::string got;
  for (int32_t t : all) got += real.push(t).text;
  got += real.flush();
  EXPECT_EQ(got, tok.decode(all));
  EXPECT_EQ(got, text);
}

}  // namespace
}  // namespace myriad::infer
