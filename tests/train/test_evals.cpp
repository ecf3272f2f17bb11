// Long-context evaluation (TRAINING.md §6) and stage gates (§5.4): the serving path's segmented
// prefill equals one pass, the engine's batched greedy decode equals the decoder's own, grids come
// back in shape on a tiny random model, the scorer is exact match, effective length follows its
// definition, and each gate rule fails on its own case.
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "core/autograd.h"
#include "data/corpus.h"
#include "model/config.h"
#include "ops/ops.h"
#include "train/evals.h"

namespace myriad::train {
namespace {

namespace fs = std::filesystem;

// The micro model gains nothing from threads; one keeps it fast on a loaded machine.
struct OneThread {
  int threads = omp_get_max_threads();
  OneThread() { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(threads); }
};

const data::Tokenizer& tokenizer() {
  struct Holder {
    fs::path dir = fs::temp_directory_path() / cat("myriad_test_evals-", getpid());
    data::Tokenizer tok;
    Holder() : tok(make(dir)) {}
    ~Holder() { fs::remove_all(dir); }
    static data::Tokenizer make(const fs::path& d) {
      fs::create_directories(d);
      auto docs = data::synthetic_fallback_corpus(7, 120000);
      for (const auto& s : data::Filler::fixed().sentences) docs.push_back(s);
      return data::Tokenizer::train(docs, 512, (d / "t.model").string());
    }
  };
  static Holder h;
  return h.tok;
}

const model::Decoder& tiny_model() {
  static const model::Decoder m = [] {
    model::ModelConfig c = model::tiny();
    c.vocab_size = tokenizer().vocab_size();
    c.num_hidden_layers = 2;
    c.hidden_size = 64;
    c.intermediate_size = 128;
    c.moe_intermediate_size = 32;
    c.linear_attn_config.kda_layers = {1};
    c.linear_attn_config.full_attn_layers = {2};
    c.validate();
    return model::Decoder::random(c, 11);
  }();
  return m;
}

EvalConfig small_config() {
  EvalConfig c;
  c.lengths = {48, 96};
  c.depths = {0, 0.5, 1};
  c.seeds = 2;
  c.segment = 32;
  c.max_new_tokens = 4;
  c.wordnet_filler = false;
  return c;
}

void expect_shape(const EvalGrid& g, size_t lengths, size_t depths) {
  ASSERT_EQ(g.lengths.size(), lengths) << g.task;
  ASSERT_EQ(g.accuracy.size(), lengths) << g.task;
  for (const auto& row : g.accuracy) {
    ASSERT_EQ(row.size(), depths) << g.task;
    for (double a : row) EXPECT_TRUE(a >= 0 && a <= 1) << g.task << ": " << a;
  }
  EXPECT_TRUE(g.mean >= 0 && g.mean <= 1);
}

TEST(Evals, GridForStage) {
  const EvalConfig c = grid_for_stage(1024);
  EXPECT_EQ(c.lengths, (std::vector<int64_t>{128, 256, 512, 1024, 2048}));
  EXPECT_EQ(c.depths.size(), 11u);
  EXPECT_DOUBLE_EQ(c.depths.front(), 0.0);
  EXPECT_DOUBLE_EQ(c.depths.back(), 1.0);
  EXPECT_EQ(c.seeds, 20);
  EXPECT_EQ(c.max_new_tokens, 16);
}

TEST(Evals, SegmentedPrefillEqualsOnePass) {
  OneThread one;
  NoGradGuard ng;
  const auto& m = tiny_model();
  const auto item = data::passkey(3, 80, 0.5, tokenizer(), data::Filler::fixed());
  const auto& ids = item.tokens;
  const int64_t T = static_cast<int64_t>(ids.size());
  ASSERT_GT(T, 40);
  const std::vector<int64_t> ids64(ids.begin(), ids.end());
  const Tensor full = m.forward(Tensor::from_ints(ids64, {1, T})).logits_BTV;
  for (int64_t seg : {T, int64_t{7}, int64_t{32}}) {
    model::DecodeCache cache = m.new_cache();
    const Tensor all = segmented_prefill(m, ids, seg, cache, /*all_logits=*/true);
    ASSERT_EQ(all.shape(), full.shape());
    const auto a = all.to_doubles(), b = full.to_doubles();
    double err = 0;
    for (size_t i = 0; i < a.size(); ++i) err = std::max(err, std::abs(a[i] - b[i]));
    EXPECT_LE(err, 1e-4) << "segment " << seg;
    EXPECT_EQ(cache.position, T);
    // The last-position form is the last row of the full logits.
    model::DecodeCache c2 = m.new_cache();
    const auto last = segmented_prefill(m, ids, seg, c2).to_doubles();
    const int64_t V = full.size(2);
    ASSERT_EQ(static_cast<int64_t>(last.size()), V);
    for (int64_t v = 0; v < V; ++v) EXPECT_NEAR(last[v], b[(T - 1) * V + v], 1e-4);
  }
}

// The evaluation generates through infer::Engine, batched; the decoder's own single-sequence
// greedy loop (one prefill into a dense DecodeCache, then a token at a time) must give the same
// tokens for every prompt, across several prefill chunks and MLA pages.
TEST(Evals, EngineGreedyMatchesDecoderGreedy) {
  OneThread one;
  NoGradGuard ng;
  const auto& m = tiny_model();
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 6; ++i)
    prompts.push_back(
        data::passkey(5 + i, 40 + 60 * i, 0.2 * i, tokenizer(), data::Filler::fixed()).tokens);
  ASSERT_GT(prompts.back().size(), 256u);  // more than one MLA page
  const int new_tokens = 8;
  const auto got = greedy_completions(m, tokenizer(), prompts, /*segment=*/48, new_tokens).tokens;
  ASSERT_EQ(got.size(), prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<int64_t> ids64(prompts[i].begin(), prompts[i].end());
    const auto gen = m.generate_greedy(
        Tensor::from_ints(ids64, {1, static_cast<int64_t>(ids64.size())}), new_tokens);
    std::vector<int32_t> want;
    for (int64_t t : gen.ids) {
      if (t == tokenizer().eos()) break;
      want.push_back(static_cast<int32_t>(t));
    }
    EXPECT_EQ(got[i], want) << "prompt " << i << " (" << prompts[i].size() << " tokens)";
  }
}

// The induction probe counts the first copy's tokens 2..n and the second copy's tokens 2..n; a
// random model copies nothing, so both losses are about the same, near ln of the alphabet size.
TEST(Evals, InductionProbeOnARandomModel) {
  OneThread one;
  const auto& m = tiny_model();
  std::vector<int32_t> alphabet;
  for (int32_t t = 300; t < 400; ++t) alphabet.push_back(t);
  const CopyLosses p = induction_probe(m, alphabet, 24, 4, 7);
  ASSERT_TRUE(std::isfinite(p.first) && std::isfinite(p.second));
  EXPECT_NEAR(p.first, p.second, 0.3);
  EXPECT_GT(p.first, 3.0);  // a random model spreads its mass over the whole vocabulary
  const CopyLosses again = induction_probe(m, alphabet, 24, 4, 7);
  EXPECT_EQ(again.first, p.first);  // seeded
  EXPECT_THROW(induction_probe(m, {}, 24, 4, 7), myriad::Error);
  EXPECT_THROW(induction_probe(m, alphabet, 1, 4, 7), myriad::Error);
}

TEST(Evals, GridsEndToEnd) {
  OneThread one;
  const auto& m = tiny_model();
  const EvalConfig c = small_config();
  expect_shape(eval_passkey(m, tokenizer(), c, 1), 2, 3);
  const EvalGrid mk = eval_mk_niah(m, tokenizer(), c, 1, 2);
  EXPECT_EQ(mk.task, "mk_niah_k2");
  EXPECT_TRUE(mk.depths.empty());
  expect_shape(mk, 2, 1);
  const EvalGrid vt = eval_variable_tracking(m, tokenizer(), c, 1, 1);
  EXPECT_EQ(vt.task, "vt_h1");
  expect_shape(vt, 2, 1);
  ASSERT_EQ(vt.recovered.size(), 2u);
  for (const auto& row : vt.recovered)
    for (double r : row) EXPECT_TRUE(r >= 0 && r <= 1);
  // Same seed, same grid.
  EXPECT_EQ(eval_passkey(m, tokenizer(), c, 1).accuracy,
            eval_passkey(m, tokenizer(), c, 1).accuracy);
}

TEST(Evals, ExactMatchScorer) {
  EXPECT_TRUE(exact_match("12345", "12345"));
  EXPECT_TRUE(exact_match(" 12345.", "12345"));
  EXPECT_TRUE(exact_match("  12345\nWhat is", "12345"));
  EXPECT_TRUE(exact_match(" is 12345 and 999", "12345"));
  EXPECT_FALSE(exact_match(" 123456", "12345"));
  EXPECT_FALSE(exact_match(" 1234", "12345"));
  EXPECT_FALSE(exact_match(" 1234 5", "12345"));
  EXPECT_FALSE(exact_match(" 54321 12345", "12345"));  // the first number counts
  EXPECT_FALSE(exact_match("", "12345"));
  EXPECT_FALSE(exact_match(" pass key", "12345"));
  // VT: the set of names before the first period.
  EXPECT_TRUE(exact_match(" ABCDE FGHIJ.", "ABCDE FGHIJ"));
  EXPECT_TRUE(exact_match(" FGHIJ, ABCDE. KLMNO", "ABCDE FGHIJ"));
  EXPECT_FALSE(exact_match(" ABCDE.", "ABCDE FGHIJ"));
  EXPECT_FALSE(exact_match(" ABCDE FGHIJ KLMNO.", "ABCDE FGHIJ"));
  EXPECT_DOUBLE_EQ(recovered_fraction(" ABCDE KLMNO.", "ABCDE FGHIJ"), 0.5);
  EXPECT_DOUBLE_EQ(recovered_fraction(" FGHIJ ABCDE", "ABCDE FGHIJ"), 1.0);
  EXPECT_DOUBLE_EQ(recovered_fraction(" nothing", "ABCDE FGHIJ"), 0.0);
}

EvalGrid grid(const std::string& task, std::vector<int64_t> lengths,
              std::vector<std::vector<double>> acc) {
  EvalGrid g{task, std::move(lengths), {}, std::move(acc), {}, 0};
  return g;
}

TEST(Evals, EffectiveLength) {
  // Means per length over the two tasks: 1.0, 0.925, 0.85, 0.95 -> longest >= 0.90 is 800.
  const auto a = grid("passkey", {100, 200, 400, 800}, {{1, 1}, {1, 0.9}, {0.8, 0.8}, {1, 1}});
  const auto b = grid("vt_h1", {100, 200, 400, 800}, {{1}, {0.9}, {0.9}, {0.9}});
  EXPECT_DOUBLE_EQ(effective_length({a, b}), 800);
  auto c = b;
  c.accuracy[3] = {0.7};  // 0.85 at 800
  EXPECT_DOUBLE_EQ(effective_length({a, c}), 200);
  EXPECT_DOUBLE_EQ(effective_length({grid("vt_h1", {100}, {{0.5}})}), 0);
  EXPECT_DOUBLE_EQ(effective_length({}), 0);
  // Only lengths present in every grid count.
  EXPECT_DOUBLE_EQ(effective_length({a, grid("mk_niah_k2", {100, 200}, {{1}, {1}})}), 200);
}

TEST(Evals, StageGateRules) {
  const int64_t L = 1024;
  const std::vector<int64_t> lens = {128, 256, 512, 1024, 2048};
  const auto pass_pk = grid("passkey", lens, {{1, 1}, {1, 1}, {1, 0.9}, {0.96, 0.96}, {0.1, 0.2}});
  // Previous stage L/4 = 256: grid {32, ..., 512}; gated lengths <= 256 shared with now: 128, 256.
  const auto prev_mk = grid("mk_niah_k4", {32, 64, 128, 256, 512}, {{1}, {1}, {0.9}, {0.8}, {0.1}});
  const auto good_mk = grid("mk_niah_k4", lens, {{0.89}, {0.78}, {0.5}, {0.4}, {0}});
  const auto prev_vt = grid("vt_h2", {32, 64, 128, 256, 512}, {{1}, {1}, {1}, {1}, {0}});
  const auto good_vt = grid("vt_h2", lens, {{0.99}, {0.98}, {0.5}, {0.1}, {0}});
  const std::vector<EvalGrid> prev = {prev_mk, prev_vt};

  const GateResult ok = stage_gate({pass_pk, good_mk, good_vt}, prev, 2.02, 2.0, false, L);
  EXPECT_TRUE(ok.pass);
  for (const auto& why : ok.reasons) ADD_FAILURE() << why;
  ASSERT_EQ(ok.notes.size(), 1u);  // 2L reported, not gated
  EXPECT_NE(ok.notes[0].find("2048"), std::string::npos);

  auto fails_with = [&](const GateResult& r, const std::string& word) {
    EXPECT_FALSE(r.pass);
    ASSERT_EQ(r.reasons.size(), 1u) << (r.reasons.empty() ? "" : r.reasons[0]);
    EXPECT_NE(r.reasons[0].find(word), std::string::npos) << r.reasons[0];
  };
  // (1) passkey below 0.95 at a length <= L.
  auto bad_pk = pass_pk;
  bad_pk.accuracy[3] = {1, 0.88};
  fails_with(stage_gate({bad_pk, good_mk, good_vt}, prev, 2.0, 2.0, false, L), "passkey");
  fails_with(stage_gate({good_mk, good_vt}, prev, 2.0, 2.0, false, L), "passkey");
  // (2) MK-NIAH more than 2 points below the previous stage at a passed length.
  auto bad_mk = good_mk;
  bad_mk.accuracy[1] = {0.77};
  fails_with(stage_gate({pass_pk, bad_mk, good_vt}, prev, 2.0, 2.0, false, L), "mk_niah_k4");
  auto bad_vt = good_vt;
  bad_vt.accuracy[0] = {0.95};
  fails_with(stage_gate({pass_pk, good_mk, bad_vt}, prev, 2.0, 2.0, false, L), "vt_h2");
  // (3) short-context loss more than 2% above stage 0's.
  fails_with(stage_gate({pass_pk, good_mk, good_vt}, prev, 2.05, 2.0, false, L), "loss");
  fails_with(stage_gate({pass_pk, good_mk, good_vt}, prev, NAN, 2.0, false, L), "loss");
  // (4) an unresolved spike.
  fails_with(stage_gate({pass_pk, good_mk, good_vt}, prev, 2.0, 2.0, true, L), "spike");
  // Stage 0 has no previous stage: rule 2 is vacuous.
  EXPECT_TRUE(stage_gate({pass_pk}, {}, 2.0, 2.0, false, L).pass);
}

// The recipe's [eval] section: defaults, lengths from the stage length, and the evaluator's gate
// chaining (stage 0's held-out loss is the reference of every later stage).
TEST(Evals, StageEvaluatorFromRecipe) {
  const std::string base =
      "[model]\npreset = \"tiny\"\n[[stage]]\nseq_len = 256\nsteps = 2\n"
      "tokens_per_step = 512\n";
  EXPECT_FALSE(Recipe::parse(base).eval.enabled);
  const Recipe r = Recipe::parse(base +
                                 "[eval]\ntasks = [\"passkey\", \"vt\"]\nseeds = 1\n"
                                 "length_factors = [0.125, 0.25, 1, 2]\nmax_length = 256\n"
                                 "depths = [0.5]\nvt_hops = 1\n");
  EXPECT_TRUE(r.eval.enabled);
  auto err = [&](const std::string& extra) {
    try {
      Recipe::parse(base + "[eval]\n" + extra);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(err("tasks = [\"ruler\"]").find("eval.tasks"), std::string::npos);
  EXPECT_NE(err("depths = [1.5]").find("eval.depths"), std::string::npos);
  EXPECT_NE(err("seeds = 0").find("eval.seeds"), std::string::npos);
  EXPECT_NE(err("gate = \"maybe\"").find("eval.gate"), std::string::npos);
  EXPECT_NE(err("tasks = \"passkey\"").find("expected an array"), std::string::npos);
  EXPECT_NE(err("colour = 1").find("unknown key eval.colour"), std::string::npos);

  StageEvaluator ev(r.eval, 5);
  // 128 × {1/8, 1/4, 1, 2} capped at 256, at least 16 tokens.
  EXPECT_EQ(ev.config_for(128).lengths, (std::vector<int64_t>{16, 32, 128, 256}));
  EXPECT_EQ(ev.config_for(1024).lengths, (std::vector<int64_t>{128, 256}));
  OneThread one;
  const auto a = ev.evaluate(tiny_model(), tokenizer(), "s0", 64, 10, 3.0, false);
  ASSERT_EQ(a.grids.size(), 2u);
  EXPECT_EQ(a.grids[0].task, "passkey");
  EXPECT_EQ(a.grids[1].task, "vt_h1");
  EXPECT_EQ(a.grids[0].lengths, (std::vector<int64_t>{16, 64, 128}));
  // A random model fails the passkey rule; a worse held-out loss than stage 0's fails rule (3).
  EXPECT_FALSE(a.gate.pass);
  const auto b = ev.evaluate(tiny_model(), tokenizer(), "s1", 64, 20, 3.5, true);
  const auto has = [](const GateResult& g, const char* s) {
    return std::any_of(g.reasons.begin(), g.reasons.end(),
                       [&](const std::string& r) { return r.find(s) != std::string::npos; });
  };
  EXPECT_TRUE(has(b.gate, "exceeds 1.02"));
  EXPECT_TRUE(has(b.gate, "spike"));
  EXPECT_FALSE(has(a.gate, "exceeds 1.02"));
  EXPECT_EQ(ev.outcomes().size(), 2u);
}

}  // namespace
}  // namespace myriad::train
