// "calculator" (TRAINING.md §8.1): compute a 3-digit × 2-digit product plus a 1–2 digit addend,
// stated as e.g. "347*29+18". The one tool, calc {"expr": "..."}, evaluates integer expressions
// with + - * and parentheses through a small recursive-descent parser (nothing else is evaluated)
// and answers the integer or "error: <reason>". An assistant message without a tool call is the
// final answer: R = 1 when its trimmed content is the exact result. Process rewards: +0.1 per call
// that evaluates (at most +0.2 in all), -0.1 per malformed call, unknown tool or failed
// evaluation, +0.05 for an integer final answer; the running sum is kept within [-0.5, 0.25].
// The expert calls calc on the whole task and then answers its result, except in a `noise`
// fraction of episodes (decided once per episode from the seed), where it answers at once.
#include <algorithm>
#include <optional>
#include <stdexcept>

#include "agent/environment.h"
#include "core/error.h"
#include "serve/protocol.h"

namespace myriad::agent {
namespace {

using json = nlohmann::json;

bool is_integer(const std::string& s) {
  const size_t b = !s.empty() && s[0] == '-' ? 1 : 0;
  return s.size() > b && std::all_of(s.begin() + static_cast<ptrdiff_t>(b), s.end(),
                                     [](char c) { return c >= '0' && c <= '9'; });
}

// expr := term (('+' | '-') term)*; term := factor ('*' factor)*;
// factor := ('+' | '-') factor | digits | '(' expr ')'. Spaces are allowed between tokens.
// Failures throw std::invalid_argument with a short reason.
class ExprParser {
 public:
  explicit ExprParser(std::string_view s) : s_(s) {}

  int64_t parse() {
    if (s_.size() > 256) throw std::invalid_argument("expression too long");
    skip();
    if (i_ == s_.size()) throw std::invalid_argument("empty expression");
    const int64_t v = expr();
    if (i_ != s_.size()) throw std::invalid_argument(unexpected());
    return v;
  }

 private:
  std::string_view s_;
  size_t i_ = 0;
  int depth_ = 0;

  void skip() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t')) ++i_;
  }
  bool eat(char c) {
    skip();
    if (i_ < s_.size() && s_[i_] == c) {
      ++i_;
      skip();
      return true;
    }
    return false;
  }
  static int64_t add(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_add_overflow(a, b, &r)) throw std::invalid_argument("overflow");
    return r;
  }
  static int64_t sub(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_sub_overflow(a, b, &r)) throw std::invalid_argument("overflow");
    return r;
  }
  static int64_t mul(int64_t a, int64_t b) {
    int64_t r = 0;
    if (__builtin_mul_overflow(a, b, &r)) throw std::invalid_argument("overflow");
    return r;
  }
  int64_t expr() {
    int64_t v = term();
    for (;;) {
      if (eat('+'))
        v = add(v, term());
      else if (eat('-'))
        v = sub(v, term());
      else
        return v;
    }
  }
  int64_t term() {
    int64_t v = factor();
    while (eat('*')) v = mul(v, factor());
    return v;
  }
  int64_t factor() {
    if (++depth_ > 64) throw std::invalid_argument("too deeply nested");
    int64_t v = 0;
    skip();
    if (eat('-')) {
      v = sub(0, factor());
    } else if (eat('+')) {
      v = factor();
    } else if (eat('(')) {
      v = expr();
      if (!eat(')')) throw std::invalid_argument("missing ')'");
    } else if (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') v = add(mul(v, 10), s_[i_++] - '0');
      skip();
    } else if (i_ == s_.size()) {
      throw std::invalid_argument("unexpected end");
    } else {
      throw std::invalid_argument(unexpected());
    }
    --depth_;
    return v;
  }
  std::string unexpected() const {
    std::string s = "unexpected '";  // (appending: GCC 12 warns falsely about "..." + string)
    s += s_[i_];
    return s += "'";
  }
};

class Calculator final : public Environment {
 public:
  std::string name() const override { return "calculator"; }

  std::string reset(uint64_t seed) override {
    const bool heldout = seed >= kHeldoutSeedBase;
    data::Rng rng(seed);
    do {
      const int64_t a = 100 + static_cast<int64_t>(rng.below(900));
      const int64_t b = 10 + static_cast<int64_t>(rng.below(90));
      const int64_t c = 1 + static_cast<int64_t>(rng.below(99));
      task_ = std::to_string(a) + "*" + std::to_string(b) + "+" + std::to_string(c);
      answer_ = a * b + c;
    } while (heldout_task(task_) != heldout);
    episode_u_ = rng.uniform();
    turns_ = calls_rewarded_ = 0;
    process_sum_ = reward_ = 0;
    last_result_.reset();
    started_ = true;
    done_ = false;
    return task_;
  }

  StepResult step(const std::string& message) override {
    MYRIAD_CHECK(started_ && !done_, "calculator: step() needs a running episode (call reset)");
    ++turns_;
    StepResult res;
    double r = 0;
    const serve::ParsedOutput parsed = serve::parse_tool_calls(message);
    if (parsed.tool_calls.empty() && message.find("<tool_call>") == std::string::npos) {
      const std::string answer = trim(message);  // the final answer
      if (is_integer(answer)) r = 0.05;
      reward_ = answer == std::to_string(answer_) ? 1.0 : 0.0;
      done_ = true;
    } else {
      res.tool_call = true;
      res.observation = call(parsed);
      res.tool_error = res.observation.starts_with("error:");
      r = res.tool_error ? -0.1 : calls_rewarded_++ < 2 ? 0.1 : 0.0;
      if (turns_ >= max_turns()) done_ = true;  // out of turns without an answer: R = 0
    }
    // Clip this turn's reward so that the running sum stays within [-0.5, 0.25].
    const double sum = std::clamp(process_sum_ + r, -0.5, 0.25);
    res.process_reward = sum - process_sum_;
    process_sum_ = sum;
    res.done = done_;
    if (done_) res.observation.clear();
    return res;
  }

  bool done() const override { return done_; }
  double terminal_reward() const override { return reward_; }
  bool solved() const override { return done_ && reward_ >= 1.0; }
  int max_turns() const override { return 4; }

  std::vector<ToolSpec> tools() const override {
    return {{"calc", "Evaluates an integer expression with + - * and parentheses.",
             json{{"type", "object"},
                  {"properties", {{"expr", {{"type", "string"}}}}},
                  {"required", {"expr"}}}}};
  }

  std::string expert(data::Rng& rng, double noise) const override {
    MYRIAD_CHECK(started_ && !done_, "calculator: expert() needs a running episode");
    const bool use_tool = episode_u_ >= noise;
    if (use_tool && last_result_ != answer_ && turns_ + 1 < max_turns())
      return tool_call_text("calc", json{{"expr", task_}});
    return std::to_string(answer_);
  }

 private:
  std::string task_;
  int64_t answer_ = 0;
  double episode_u_ = 0;  // decides once per episode whether the expert uses the tool
  int turns_ = 0, calls_rewarded_ = 0;
  double process_sum_ = 0, reward_ = 0;
  std::optional<int64_t> last_result_;  // of the last call that evaluated
  bool started_ = false, done_ = false;

  // Runs the turn's tool call; returns the tool's text.
  std::string call(const serve::ParsedOutput& parsed) {
    if (parsed.tool_calls.size() != 1) return "error: malformed call";
    const serve::ToolCall& c = parsed.tool_calls[0];
    if (c.name != "calc") return "error: unknown tool";
    const json args = json::parse(c.arguments, nullptr, false);
    if (!args.is_object() || !args.contains("expr") || !args["expr"].is_string())
      return "error: malformed call";
    try {
      const int64_t v = ExprParser(args["expr"].get<std::string>()).parse();
      last_result_ = v;
      return std::to_string(v);
    } catch (const std::invalid_argument& e) {
      return std::string("error: ") + e.what();
    }
  }
};

}  // namespace

MYRIAD_REGISTER_ENVIRONMENT("calculator", Calculator);

}  // namespace myriad::agent
