// The trajectory record of TRAINING.md §7.1 (one per sampled episode) and the chat rendering that
// both rollouts and SFT traces use, so that the tokens a policy is trained on are the tokens it
// produced: token in, token out, never decoded and re-encoded.
//
// An episode renders through a serve::ChatTemplate: the prompt (tools preamble, the task as the
// user message, the generation opener), then per assistant turn the policy's tokens up to and
// including the template's end marker (mask 1), then the environment's reply rendered as a tool or
// user message plus the next generation opener, tokenised once and forced (mask 0).
#pragma once
#include <cstdint>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "agent/environment.h"
#include "data/tokenizer.h"
#include "serve/protocol.h"

namespace myriad::agent {

struct TurnSpan {
  int64_t start = 0, end = 0;  // token range [start, end)
  std::string role;            // prompt | assistant | tool | env
  bool truncated = false;      // an assistant turn cut by its budget, or a cut tool output
};

struct Trajectory {
  std::string env;
  std::vector<int32_t> tokens;
  std::vector<uint8_t> loss_mask;    // 1 only for tokens the policy sampled
  std::vector<float> logp_behavior;  // sampler log-prob of sampled tokens; NaN where mask = 0
  std::vector<TurnSpan> turns;
  std::vector<double> r_turn;  // process reward of each assistant turn
  double R = 0;                // terminal reward
  bool solved = false;
  bool truncated = false;
  std::string truncation_reason;  // "turn_budget", "total_budget" or "context" when truncated
  int64_t tool_calls = 0, tool_errors = 0;
  uint64_t policy_version = 0, task_id = 0, group_id = 0, env_seed = 0;

  int64_t assistant_turns() const { return static_cast<int64_t>(r_turn.size()); }
  // The assistant turn index of every token (-1 outside assistant turns).
  std::vector<int32_t> token_turns() const;
  uint64_t token_hash() const;  // FNV-1a over the token ids
  nlohmann::json to_json() const;
  static Trajectory from_json(const nlohmann::json& j);  // throws naming the bad field
};

// The template agent episodes use: the default roles with no text between a marker and the
// message, so encoding a whole conversation equals encoding its messages one by one (the server
// re-renders history; the tokens then match what the policy produced).
serve::ChatTemplate agent_template();

struct EpisodeLimits {
  int64_t max_new_tokens_per_turn = 64;
  int64_t max_total_tokens = 256;
  int64_t max_tool_tokens = 48;  // a longer environment reply is cut and marked "[truncated]"
};

// Builds one trajectory turn by turn; the policy (a sampler or an SFT expert) supplies each
// assistant turn's tokens.
class Episode {
 public:
  Episode(const data::Tokenizer& tok, const serve::ChatTemplate& tmpl, std::string env_name,
          uint64_t seed, EpisodeLimits limits = {});
  Environment& environment() { return *env_; }
  const Trajectory& trajectory() const { return tr_; }
  Trajectory take() { return std::move(tr_); }
  bool finished() const { return finished_; }
  // The token budget the next assistant turn may use (0 when the total budget is spent).
  int64_t turn_budget() const;
  int32_t end_token() const { return end_; }
  // One assistant turn: the tokens sampled (ending with end_token() unless the turn ran out of
  // budget or the policy emitted EOS) and their log-probs (empty: NaN, e.g. expert traces).
  // Runs the environment, forces its reply, and finishes the episode when it is over.
  void add_turn(const std::vector<int32_t>& sampled, const std::vector<float>& logps = {});

 private:
  void finish(bool truncated, const std::string& reason);
  void force(const std::vector<int32_t>& ids, const std::string& role, bool cut);
  const data::Tokenizer& tok_;
  serve::ChatTemplate tmpl_;
  std::unique_ptr<Environment> env_;
  EpisodeLimits lim_;
  Trajectory tr_;
  int32_t end_ = -1;
  bool finished_ = false;
};

// The prompt of an episode as the server renders a chat request with the environment's tools.
serve::ChatRequest episode_request(const Environment& env, const std::string& first_message);

// An SFT trace: the environment's scripted expert plays every turn (noise as in §8), its
// messages tokenised as a policy would have produced them.
Trajectory expert_trajectory(const data::Tokenizer& tok, const std::string& env_name, uint64_t seed,
                             double noise, const EpisodeLimits& limits = {});
// The plain text of an expert episode (all messages, markers left out) for tokenizer training.
std::string expert_text(const std::string& env_name, uint64_t seed, double noise);

}  // namespace myriad::agent
