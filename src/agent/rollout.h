// Rollouts through infer::Engine (TRAINING.md §7.2): every task runs as one episode, all of them
// in flight together (the engine batches their decode steps). Each assistant turn is one engine
// request over the episode's tokens so far that stops on the template's end marker; the
// environment's reply is tokenised once and forced (mask 0) before the next turn. Sampled tokens
// keep the engine's log-probs (logp_behavior). Budgets per turn and in total come from
// EpisodeLimits, and a trajectory cut by one says so.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "agent/trajectory.h"
#include "infer/engine.h"

namespace myriad::agent {

struct RolloutTask {
  std::string env;
  uint64_t seed = 0;      // the environment's task seed
  uint64_t task_id = 0;   // for the record
  uint64_t group_id = 0;  // samples of one task share a group
};

struct RolloutConfig {
  EpisodeLimits limits;
  double temperature = 1.0;     // 0: greedy
  uint64_t seed = 0;            // sampling seed; each (task index, turn) derives its own
  uint64_t policy_version = 0;  // written into every trajectory
};

// Returns one trajectory per task, in task order. Throws if the engine reports an error.
std::vector<Trajectory> rollout(infer::Engine& engine, const data::Tokenizer& tok,
                                const serve::ChatTemplate& tmpl,
                                const std::vector<RolloutTask>& tasks, const RolloutConfig& cfg);

}  // namespace myriad::agent
