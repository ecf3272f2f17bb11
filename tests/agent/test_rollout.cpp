// Trajectories, SFT traces and rollouts through infer::Engine (TRAINING.md §7.1-§7.2, §7.6 items
// 8, 9 and 15): forced tool output appears byte-exactly with mask 0 and no log-prob, the trained
// tokens are the rollout's tokens (hash) while decode -> encode is not an identity, both budgets
// are enforced and flagged, rollouts repeat for a seed, records round-trip through JSON, and SFT
// documents carry the assistant-only loss mask.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <set>

#include "agent/rollout.h"
#include "agent/sft.h"
#include "model/config.h"
#include "model/decoder.h"

using namespace myriad;
using namespace myriad::agent;

namespace {

const std::vector<std::string> kEnvs = {"calculator", "kv_lookup", "gridworld"};

struct World {
  data::Tokenizer tok;
  model::Decoder dec;
};

World& world() {
  static World* w = [] {
    std::vector<std::string> docs;
    for (const std::string& e : kEnvs)
      for (uint64_t s = 0; s < 300; ++s) docs.push_back(expert_text(e, s, 0.3));
    const std::string path =
        (std::filesystem::temp_directory_path() / "myriad_test_rollout_tok.model").string();
    data::Tokenizer tok = data::Tokenizer::train(docs, 400, path);
    model::ModelConfig c = model::preset("tiny");
    c.vocab_size = tok.vocab_size();
    return new World{std::move(tok), model::Decoder::random(c, 5)};
  }();
  return *w;
}

infer::EngineConfig engine_config(int64_t batch) {
  infer::EngineConfig ec;
  ec.max_batch = batch;
  ec.prefix_cache_entries = 0;
  ec.block_tokens = 64;
  return ec;
}

std::vector<RolloutTask> tasks(const std::string& env, int n, int group) {
  std::vector<RolloutTask> t;
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < group; ++j)
      t.push_back({env, static_cast<uint64_t>(100 + i), static_cast<uint64_t>(i),
                   static_cast<uint64_t>(i)});
  return t;
}

// Spans are contiguous, cover the tokens, and masks / log-probs follow the roles.
void check_layout(const Trajectory& t) {
  ASSERT_EQ(t.tokens.size(), t.loss_mask.size());
  ASSERT_EQ(t.tokens.size(), t.logp_behavior.size());
  int64_t at = 0, assistant = 0;
  for (const TurnSpan& s : t.turns) {
    EXPECT_EQ(s.start, at);
    at = s.end;
    for (int64_t i = s.start; i < s.end; ++i) {
      const auto u = static_cast<size_t>(i);
      EXPECT_EQ(t.loss_mask[u], s.role == "assistant" ? 1 : 0);
      if (s.role != "assistant") {
        EXPECT_TRUE(std::isnan(t.logp_behavior[u]));
      }
    }
    assistant += s.role == "assistant";
  }
  EXPECT_EQ(at, static_cast<int64_t>(t.tokens.size()));
  EXPECT_EQ(assistant, t.assistant_turns());
}

}  // namespace

// §7.6 item 15: the expert's tool results are forced verbatim (mask 0, no log-prob) and decode
// to the environment's exact output; the prompt is the server's rendering of the chat request.
TEST(RlPitfalls, P15_ForcedToolOutputIsExactAndNeverSampled) {
  World& w = world();
  int forced_tool_spans = 0;
  for (const std::string& e : kEnvs)
    for (uint64_t s = 0; s < 20; ++s) {
      const Trajectory t = expert_trajectory(w.tok, e, s, 0.0);
      check_layout(t);
      EXPECT_TRUE(t.solved) << e << " seed " << s;
      // Replay the environment on the assistant messages: each reply is in the forced span.
      std::unique_ptr<Environment> env = make_environment(e);
      env->reset(s);
      size_t k = 0;
      for (size_t i = 0; i < t.turns.size(); ++i) {
        const TurnSpan& a = t.turns[i];
        if (a.role != "assistant") continue;
        std::vector<int32_t> msg(t.tokens.begin() + a.start, t.tokens.begin() + a.end - 1);
        const StepResult r = env->step(w.tok.decode(msg));
        EXPECT_DOUBLE_EQ(r.process_reward, t.r_turn[k++]);
        if (r.done) break;
        ASSERT_LT(i + 1, t.turns.size());
        const TurnSpan& f = t.turns[i + 1];
        const std::vector<int32_t> ids(t.tokens.begin() + f.start, t.tokens.begin() + f.end);
        const std::vector<int32_t> obs = w.tok.encode(r.observation);
        EXPECT_NE(std::search(ids.begin(), ids.end(), obs.begin(), obs.end()), ids.end());
        EXPECT_NE(w.tok.decode(ids).find(r.observation), std::string::npos);
        forced_tool_spans += f.role == "tool";
      }
    }
  EXPECT_GT(forced_tool_spans, 20);
}

// §7.6 item 8: training uses the rollout's token stream itself (the record, hashed), and
// decode -> encode is not an identity on sampled tokens, which is why it is never done.
TEST(RlPitfalls, P08_TokenInTokenOut) {
  World& w = world();
  infer::Engine engine(w.dec, w.tok, engine_config(8));
  RolloutConfig rc;
  rc.seed = 3;
  const std::vector<Trajectory> got =
      rollout(engine, w.tok, agent_template(), tasks("calculator", 4, 2), rc);
  for (const Trajectory& t : got) {
    check_layout(t);
    const Trajectory back = Trajectory::from_json(nlohmann::json::parse(t.to_json().dump()));
    EXPECT_EQ(back.token_hash(), t.token_hash());
    EXPECT_EQ(back.loss_mask, t.loss_mask);
    for (size_t i = 0; i < t.tokens.size(); ++i)
      if (t.loss_mask[i]) {
        EXPECT_EQ(back.logp_behavior[i], t.logp_behavior[i]);
      }
  }
  // Two pieces whose text re-encodes differently.
  bool found = false;
  for (int a = 300; a < w.tok.vocab_size() && !found; ++a)
    for (int b = 300; b < w.tok.vocab_size() && !found; ++b) {
      if (w.tok.is_special(a) || w.tok.is_special(b)) continue;
      const std::vector<int32_t> ids = {a, b};
      found = w.tok.encode(w.tok.decode(ids)) != ids;
    }
  EXPECT_TRUE(found) << "every piece pair re-encoded to itself";
}

// §7.6 item 9: the per-turn and the total budget are both enforced, and the cut is flagged.
TEST(RlPitfalls, P09_BudgetsAreEnforcedAndFlagged) {
  World& w = world();
  infer::Engine engine(w.dec, w.tok, engine_config(8));
  RolloutConfig rc;
  rc.seed = 4;
  rc.limits.max_new_tokens_per_turn = 3;  // an untrained model rarely ends a turn in 3 tokens
  for (const Trajectory& t :
       rollout(engine, w.tok, agent_template(), tasks("kv_lookup", 4, 2), rc)) {
    for (const TurnSpan& s : t.turns)
      if (s.role == "assistant") {
        EXPECT_LE(s.end - s.start, 3);
      }
    if (t.turns.back().role == "assistant" && t.turns.back().truncated) {
      EXPECT_TRUE(t.truncated);
      EXPECT_EQ(t.truncation_reason, "turn_budget");
    }
    EXPECT_FALSE(t.truncated && t.solved);
  }
  Episode probe(w.tok, agent_template(), "gridworld", 1);
  const auto prompt = static_cast<int64_t>(probe.trajectory().tokens.size());
  rc.limits.max_new_tokens_per_turn = 64;
  rc.limits.max_total_tokens = prompt + 5;
  int truncated = 0;
  for (const Trajectory& t :
       rollout(engine, w.tok, agent_template(), tasks("gridworld", 4, 2), rc)) {
    EXPECT_LE(static_cast<int64_t>(t.tokens.size()), rc.limits.max_total_tokens);
    if (t.truncated) {
      ++truncated;
      EXPECT_TRUE(t.truncation_reason == "total_budget") << t.truncation_reason;
    }
  }
  EXPECT_GT(truncated, 0);
}

// One seed, one set of trajectories: with one sequence at a time and with batched decoding.
TEST(Rollout, RepeatsForASeed) {
  World& w = world();
  for (int64_t batch : {1, 16}) {
    infer::Engine engine(w.dec, w.tok, engine_config(batch));
    RolloutConfig rc;
    rc.seed = 9;
    rc.limits.max_new_tokens_per_turn = 16;
    const auto a = rollout(engine, w.tok, agent_template(), tasks("calculator", 3, 3), rc);
    const auto b = rollout(engine, w.tok, agent_template(), tasks("calculator", 3, 3), rc);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token_hash(), b[i].token_hash()) << "batch " << batch << " task " << i;
      EXPECT_EQ(a[i].task_id, i / 3);
    }
  }
}

// SFT documents: the loss mask is 1 exactly on the assistant's tokens, and dialogue answers are
// the gloss followed by the end marker.
TEST(Sft, DocumentsMaskAllButTheAssistant) {
  World& w = world();
  const SftDocs d = sft_documents({{"calculator", 0.6, 30}, {"gridworld", 0.25, 30}}, w.tok, 1);
  ASSERT_EQ(d.tokens.size(), 60u);
  std::set<std::string> sources(d.source.begin(), d.source.end());
  EXPECT_EQ(sources.size(), 2u);
  for (size_t i = 0; i < d.tokens.size(); ++i) {
    ASSERT_EQ(d.tokens[i].size(), d.weights[i].size());
    int64_t ones = 0;
    for (uint8_t x : d.weights[i]) ones += x;
    EXPECT_GT(ones, 0);
    EXPECT_LT(ones, static_cast<int64_t>(d.tokens[i].size()));
    EXPECT_EQ(d.weights[i].front(), 0);
  }
  EXPECT_THROW(sft_documents({{"nope", 0, 1}}, w.tok, 1), std::invalid_argument);
}

TEST(Trajectory, FromJsonNamesTheBadField) {
  nlohmann::json j = expert_trajectory(world().tok, "calculator", 1, 0).to_json();
  j.erase("loss_mask");
  try {
    Trajectory::from_json(j);
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("loss_mask"), std::string::npos);
  }
}
