// Agentic environments (TRAINING.md §8) behind one small interface. An episode is a chat: the
// environment's first user message states the task; each assistant message is one turn; the
// environment answers a turn with a tool result (role "tool", the turn held an OpenAI-style tool
// call `<tool_call>{"name": N, "arguments": {...}}</tool_call>` as serve::format_tool_call writes
// it) or an observation (role "user"), a process reward, and whether the episode is over. The
// terminal reward is read once it is.
//
// Adding an environment is one file: a subclass plus MYRIAD_REGISTER_ENVIRONMENT("name", Class).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "data/corpus.h"  // data::Rng

namespace myriad::agent {

// One function tool as OpenAI's `tools` lists it (type "function").
struct ToolSpec {
  std::string name, description;
  nlohmann::json parameters;  // JSON Schema object
};

struct StepResult {
  std::string observation;    // the environment's next message (empty when done)
  std::string role = "tool";  // "tool": a tool result; "user": an environment observation
  double process_reward = 0;  // r_turn of the assistant turn just taken
  bool done = false;
  bool tool_call = false;   // the turn called a tool (tool-call rate)
  bool tool_error = false;  // a malformed call, an unknown tool or a failed evaluation
};

class Environment {
 public:
  virtual ~Environment() = default;
  virtual std::string name() const = 0;
  // Starts episode `seed`: the same seed always gives the same task. Returns the user's first
  // message. Seeds below 2^63 are training tasks; the held-out split uses seeds from
  // kHeldoutSeedBase up, and environments draw the two splits so that they never share a task.
  virtual std::string reset(uint64_t seed) = 0;
  // One assistant turn: the message text the policy wrote (without the end marker).
  virtual StepResult step(const std::string& message) = 0;
  virtual bool done() const = 0;
  // Valid once done: R, the terminal reward, and whether the task was solved (pass@k counts it).
  virtual double terminal_reward() const = 0;
  virtual bool solved() const = 0;
  virtual std::vector<ToolSpec> tools() const = 0;  // empty when turns are not tool calls
  // The next assistant message of a scripted expert in the current state, with the §8 noise
  // (`noise` in [0, 1]: 0 is the clean expert). Used to write SFT traces.
  virtual std::string expert(data::Rng& rng, double noise) const = 0;
  virtual int max_turns() const = 0;  // the environment ends the episode after this many turns
};

inline constexpr uint64_t kHeldoutSeedBase = 1ull << 63;

using EnvironmentFactory = std::function<std::unique_ptr<Environment>()>;
// Throws std::invalid_argument naming the known environments for an unknown name.
std::unique_ptr<Environment> make_environment(const std::string& name);
std::vector<std::string> environment_names();
bool register_environment(const std::string& name, EnvironmentFactory f);

#define MYRIAD_REGISTER_ENVIRONMENT(NAME, CLASS)                     \
  [[maybe_unused]] static const bool myriad_env_registered_##CLASS = \
      ::myriad::agent::register_environment(NAME, [] { return std::make_unique<CLASS>(); })

// Helpers the environments share.
std::string trim(std::string_view s);  // without surrounding spaces, tabs and newlines
// Which split a task belongs to, from a hash of its text: 1 in `one_in` tasks is held out.
// Environments redraw a seed's task until it lands in the seed's split, so the two never meet.
bool heldout_task(std::string_view task, uint64_t one_in = 8);
// A seed derived from two numbers (SplitMix64 of their combination).
uint64_t mix_seed(uint64_t a, uint64_t b);

// A tool call in the server's format: <tool_call>{"name": N, "arguments": A}</tool_call>.
std::string tool_call_text(const std::string& name, const nlohmann::json& arguments);

}  // namespace myriad::agent
