// "kv_lookup" (TRAINING.md §8.2, synthetic variant): a hidden table of 32 distinct keys drawn from
// K0..K99 maps every key to another key of the table; the task "follow K17 for 3 hops" asks for
// v3 of the chain K17 -> v1 -> v2 -> v3 (which never repeats a key). The one tool, get
// {"key": "K17"}, answers the value or "error: unknown key". Process rewards: +0.2/h for fetching
// the next key of the chain (first the start key, then v1, ...; each credited once), -0.1 for any
// other key (off the chain, out of order, or fetched before), an unknown key, a malformed call or
// an unknown tool. An assistant message without a tool call is the final answer: R = 1 when its
// trimmed content is vh. The expert follows the chain; in a `noise` fraction of episodes (decided
// once per episode from the seed) it stops one hop early and answers v(h-1) (the start key when
// h = 1).
#include <algorithm>
#include <vector>

#include "agent/environment.h"
#include "core/error.h"
#include "serve/protocol.h"

namespace myriad::agent {
namespace {

using json = nlohmann::json;

constexpr int kTableSize = 32, kKeySpace = 100, kMaxHops = 4;

std::string key_name(int k) {
  std::string s = "K";  // (not "K" + to_string: GCC 12 warns falsely about that)
  return s += std::to_string(k);
}

class KvLookup final : public Environment {
 public:
  std::string name() const override { return "kv_lookup"; }

  std::string reset(uint64_t seed) override {
    const bool heldout = seed >= kHeldoutSeedBase;
    data::Rng rng(seed);
    do draw(rng);
    while (heldout_task(task_text()) != heldout);
    episode_u_ = rng.uniform();
    turns_ = next_ = 0;
    reward_ = 0;
    started_ = true;
    done_ = false;
    return first_message();
  }

  StepResult step(const std::string& message) override {
    MYRIAD_CHECK(started_ && !done_, "kv_lookup: step() needs a running episode (call reset)");
    ++turns_;
    StepResult res;
    const serve::ParsedOutput parsed = serve::parse_tool_calls(message);
    if (parsed.tool_calls.empty() && message.find("<tool_call>") == std::string::npos) {
      reward_ = trim(message) == key_name(chain_[hops_]) ? 1.0 : 0.0;  // the final answer
      done_ = true;
    } else {
      res.tool_call = true;
      res.observation = call(parsed, res.process_reward);
      res.tool_error = res.observation.starts_with("error:");
      if (turns_ >= max_turns()) done_ = true;  // out of turns without an answer: R = 0
    }
    res.done = done_;
    if (done_) res.observation.clear();
    return res;
  }

  bool done() const override { return done_; }
  double terminal_reward() const override { return reward_; }
  bool solved() const override { return done_ && reward_ >= 1.0; }
  int max_turns() const override { return 6; }

  std::vector<ToolSpec> tools() const override {
    return {{"get", "Returns the value stored under a key of the table.",
             json{{"type", "object"},
                  {"properties", {{"key", {{"type", "string"}}}}},
                  {"required", {"key"}}}}};
  }

  std::string expert(data::Rng& rng, double noise) const override {
    MYRIAD_CHECK(started_ && !done_, "kv_lookup: expert() needs a running episode");
    const int stop = episode_u_ < noise ? hops_ - 1 : hops_;  // the noisy expert stops early
    if (next_ < stop) return tool_call_text("get", json{{"key", key_name(chain_[next_])}});
    return key_name(chain_[stop]);
  }

 private:
  int table_[kKeySpace] = {};     // value key of each key; -1: not in the table
  int chain_[kMaxHops + 1] = {};  // start, v1, ..., vh
  int hops_ = 1;
  double episode_u_ = 0;      // decides once per episode whether the expert stops early
  int turns_ = 0, next_ = 0;  // next_: chain keys fetched so far, in order
  double reward_ = 0;
  bool started_ = false, done_ = false;

  // Draws a table whose first hops_ + 1 keys (in draw order) are the chain.
  void draw(data::Rng& rng) {
    std::vector<int> keys(kKeySpace);
    for (int k = 0; k < kKeySpace; ++k) keys[static_cast<size_t>(k)] = k;
    rng.shuffle(keys);
    keys.resize(kTableSize);
    hops_ = 1 + static_cast<int>(rng.below(kMaxHops));
    std::fill(std::begin(table_), std::end(table_), -1);
    for (int i = 0; i <= hops_; ++i) chain_[i] = keys[static_cast<size_t>(i)];
    for (int i = 0; i < kTableSize; ++i) {
      const int k = keys[static_cast<size_t>(i)];
      if (i < hops_) {
        table_[k] = keys[static_cast<size_t>(i + 1)];
      } else {  // any other key of the table
        const size_t j = (static_cast<size_t>(i) + 1 + rng.below(kTableSize - 1)) % kTableSize;
        table_[k] = keys[j];
      }
    }
  }

  std::string first_message() const {
    return "follow " + key_name(chain_[0]) + " for " + std::to_string(hops_) + " hops";
  }
  // The task including its hidden table (what decides the split).
  std::string task_text() const {
    std::string s = first_message() + "|";
    for (int k = 0; k < kKeySpace; ++k) s += std::to_string(table_[k]) + ",";
    return s;
  }

  // Runs the turn's tool call and sets its process reward; returns the tool's text.
  std::string call(const serve::ParsedOutput& parsed, double& reward) {
    reward = -0.1;
    if (parsed.tool_calls.size() != 1) return "error: malformed call";
    const serve::ToolCall& c = parsed.tool_calls[0];
    if (c.name != "get") return "error: unknown tool";
    const json args = json::parse(c.arguments, nullptr, false);
    if (!args.is_object() || !args.contains("key") || !args["key"].is_string())
      return "error: malformed call";
    const std::string key = trim(args["key"].get<std::string>());
    int k = -1;
    if (key.size() >= 2 && key.size() <= 3 && key[0] == 'K' &&
        key.find_first_not_of("0123456789", 1) == std::string::npos &&
        (key.size() == 2 || key[1] != '0'))
      k = std::stoi(key.substr(1));
    if (k < 0 || table_[k] < 0) return "error: unknown key";
    if (next_ < hops_ && k == chain_[next_]) {
      reward = 0.2 / hops_;
      ++next_;
    }
    return key_name(table_[k]);
  }
};

}  // namespace

MYRIAD_REGISTER_ENVIRONMENT("kv_lookup", KvLookup);

}  // namespace myriad::agent
