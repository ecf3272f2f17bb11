// Episode rendering and the trajectory record: see trajectory.h.
#include "agent/trajectory.h"

#include <cmath>
#include <stdexcept>

#include "agent/sft.h"
#include "core/error.h"

namespace myriad::agent {
namespace {

using json = nlohmann::json;

// A role template split at its {content} placeholder.
std::pair<std::string, std::string> split_content(const std::string& pattern) {
  const size_t at = pattern.find("{content}");
  MYRIAD_CHECK(at != std::string::npos, "chat template role '", pattern, "' has no {content}");
  return {pattern.substr(0, at), pattern.substr(at + 9)};
}

std::vector<int32_t> trusted(const data::Tokenizer& tok, const std::string& text) {
  return tok.encode_parts({{text, true}});
}

template <class T>
T field(const json& j, const char* key) {
  if (!j.contains(key))
    throw std::invalid_argument(std::string("trajectory: missing '") + key + "'");
  try {
    return j.at(key).get<T>();
  } catch (const json::exception& e) {
    throw std::invalid_argument(std::string("trajectory: field '") + key + "': " + e.what());
  }
}

}  // namespace

std::vector<int32_t> Trajectory::token_turns() const {
  std::vector<int32_t> out(tokens.size(), -1);
  int32_t k = 0;
  for (const TurnSpan& s : turns) {
    if (s.role != "assistant") continue;
    for (int64_t t = s.start; t < s.end; ++t)
      if (loss_mask[static_cast<size_t>(t)]) out[static_cast<size_t>(t)] = k;
    ++k;
  }
  return out;
}

uint64_t Trajectory::token_hash() const {
  uint64_t h = 0xcbf29ce484222325ull;
  for (int32_t t : tokens)
    for (int b = 0; b < 4; ++b)
      h = (h ^ ((static_cast<uint32_t>(t) >> (8 * b)) & 0xff)) * 0x100000001b3ull;
  return h;
}

json Trajectory::to_json() const {
  json lp = json::array();
  for (float x : logp_behavior) lp.push_back(std::isnan(x) ? json(nullptr) : json(x));
  json ts = json::array();
  for (const TurnSpan& s : turns)
    ts.push_back(
        {{"start", s.start}, {"end", s.end}, {"role", s.role}, {"truncated", s.truncated}});
  return {{"env", env},
          {"tokens", tokens},
          {"loss_mask", loss_mask},
          {"logp_behavior", lp},
          {"turns", ts},
          {"r_turn", r_turn},
          {"R", R},
          {"solved", solved},
          {"truncated", truncated},
          {"truncation_reason", truncation_reason},
          {"tool_calls", tool_calls},
          {"tool_errors", tool_errors},
          {"policy_version", policy_version},
          {"task_id", task_id},
          {"group_id", group_id},
          {"env_seed", env_seed}};
}

Trajectory Trajectory::from_json(const json& j) {
  Trajectory t;
  t.env = field<std::string>(j, "env");
  t.tokens = field<std::vector<int32_t>>(j, "tokens");
  t.loss_mask = field<std::vector<uint8_t>>(j, "loss_mask");
  for (const json& x : field<json>(j, "logp_behavior"))
    t.logp_behavior.push_back(x.is_null() ? std::numeric_limits<float>::quiet_NaN()
                                          : x.get<float>());
  for (const json& s : field<json>(j, "turns"))
    t.turns.push_back({field<int64_t>(s, "start"), field<int64_t>(s, "end"),
                       field<std::string>(s, "role"), field<bool>(s, "truncated")});
  t.r_turn = field<std::vector<double>>(j, "r_turn");
  t.R = field<double>(j, "R");
  t.solved = field<bool>(j, "solved");
  t.truncated = field<bool>(j, "truncated");
  t.truncation_reason = field<std::string>(j, "truncation_reason");
  t.tool_calls = field<int64_t>(j, "tool_calls");
  t.tool_errors = field<int64_t>(j, "tool_errors");
  t.policy_version = field<uint64_t>(j, "policy_version");
  t.task_id = field<uint64_t>(j, "task_id");
  t.group_id = field<uint64_t>(j, "group_id");
  t.env_seed = field<uint64_t>(j, "env_seed");
  if (t.loss_mask.size() != t.tokens.size() || t.logp_behavior.size() != t.tokens.size())
    throw std::invalid_argument("trajectory: tokens, loss_mask and logp_behavior differ in length");
  return t;
}

serve::ChatTemplate agent_template() {
  static const serve::ChatTemplate t = serve::ChatTemplate::parse(kAgentTemplateText);
  return t;
}

serve::ChatRequest episode_request(const Environment& env, const std::string& first_message) {
  serve::ChatRequest r;
  for (const ToolSpec& s : env.tools()) r.tools.push_back({s.name, s.description, s.parameters});
  serve::Message m;
  m.role = "user";
  m.content = first_message;
  r.messages.push_back(std::move(m));
  return r;
}

Episode::Episode(const data::Tokenizer& tok, const serve::ChatTemplate& tmpl, std::string env_name,
                 uint64_t seed, EpisodeLimits limits)
    : tok_(tok), tmpl_(tmpl), env_(make_environment(env_name)), lim_(limits) {
  for (const auto& [text, id] : tok.special_tokens())
    if (text == "<|end|>") end_ = id;
  MYRIAD_CHECK(end_ >= 0, "agent: the tokenizer has no <|end|> control token");
  tr_.env = std::move(env_name);
  tr_.env_seed = seed;
  const std::string first = env_->reset(seed);
  const serve::Prompt p = serve::render_chat(tmpl_, episode_request(*env_, first));
  std::vector<data::TextPart> parts;
  for (const auto& part : p.parts) parts.push_back({part.text, part.trusted});
  std::vector<int32_t> ids = tok.encode_parts(parts);
  if (p.bos) ids.insert(ids.begin(), tok.bos());
  MYRIAD_CHECK(static_cast<int64_t>(ids.size()) < lim_.max_total_tokens, "agent: the ", tr_.env,
               " prompt (", ids.size(), " tokens) leaves no room in max_total_tokens ",
               lim_.max_total_tokens);
  force(ids, "prompt", false);
}

int64_t Episode::turn_budget() const {
  if (finished_) return 0;
  const int64_t left = lim_.max_total_tokens - static_cast<int64_t>(tr_.tokens.size());
  return std::max<int64_t>(0, std::min(lim_.max_new_tokens_per_turn, left));
}

void Episode::force(const std::vector<int32_t>& ids, const std::string& role, bool cut) {
  const auto start = static_cast<int64_t>(tr_.tokens.size());
  tr_.tokens.insert(tr_.tokens.end(), ids.begin(), ids.end());
  tr_.loss_mask.insert(tr_.loss_mask.end(), ids.size(), 0);
  tr_.logp_behavior.insert(tr_.logp_behavior.end(), ids.size(),
                           std::numeric_limits<float>::quiet_NaN());
  tr_.turns.push_back({start, static_cast<int64_t>(tr_.tokens.size()), role, cut});
}

void Episode::finish(bool truncated, const std::string& reason) {
  finished_ = true;
  tr_.truncated = truncated;
  tr_.truncation_reason = truncated ? reason : "";
  tr_.R = env_->done() ? env_->terminal_reward() : 0.0;
  tr_.solved = env_->done() && env_->solved();
}

void Episode::add_turn(const std::vector<int32_t>& sampled, const std::vector<float>& logps) {
  MYRIAD_CHECK(!finished_, "agent: add_turn on a finished episode");
  MYRIAD_CHECK(!sampled.empty(), "agent: an assistant turn needs at least one token");
  MYRIAD_CHECK(logps.empty() || logps.size() == sampled.size(), "agent: ", logps.size(),
               " log-probs for ", sampled.size(), " tokens");
  const int64_t budget = turn_budget();
  MYRIAD_CHECK(static_cast<int64_t>(sampled.size()) <= budget, "agent: a turn of ", sampled.size(),
               " tokens exceeds its budget of ", budget);
  const auto start = static_cast<int64_t>(tr_.tokens.size());
  for (size_t i = 0; i < sampled.size(); ++i) {
    tr_.tokens.push_back(sampled[i]);
    tr_.loss_mask.push_back(1);
    tr_.logp_behavior.push_back(logps.empty() ? std::numeric_limits<float>::quiet_NaN() : logps[i]);
  }
  const bool ended = sampled.back() == end_, eos = sampled.back() == tok_.eos();
  tr_.turns.push_back(
      {start, static_cast<int64_t>(tr_.tokens.size()), "assistant", !ended && !eos});
  if (!ended && !eos) {  // cut by a budget
    tr_.r_turn.push_back(0.0);
    const bool total = static_cast<int64_t>(tr_.tokens.size()) >= lim_.max_total_tokens &&
                       static_cast<int64_t>(sampled.size()) < lim_.max_new_tokens_per_turn;
    return finish(true, total ? "total_budget" : "turn_budget");
  }
  const std::vector<int32_t> body(sampled.begin(), sampled.end() - 1);
  const StepResult res = env_->step(tok_.decode(body));
  tr_.r_turn.push_back(res.process_reward);
  tr_.tool_calls += res.tool_call ? 1 : 0;
  tr_.tool_errors += res.tool_error ? 1 : 0;
  if (res.done || eos) return finish(false, "");
  // The reply: what the assistant template writes after the end marker, the tool or user
  // message, and the next generation opener, tokenised once.
  auto [a_pre, a_post] = split_content(tmpl_.assistant);
  if (a_post.rfind("<|end|>", 0) == 0) a_post.erase(0, 7);
  auto [m_pre, m_post] = split_content(res.role == "tool" ? tmpl_.tool : tmpl_.user);
  std::vector<int32_t> obs = tok_.encode(res.observation);
  const bool cut = static_cast<int64_t>(obs.size()) > lim_.max_tool_tokens;
  if (cut) {
    obs.resize(static_cast<size_t>(lim_.max_tool_tokens));
    const std::vector<int32_t> mark = tok_.encode(" [truncated]");
    obs.insert(obs.end(), mark.begin(), mark.end());
  }
  std::vector<int32_t> ids = trusted(tok_, a_post + m_pre);
  ids.insert(ids.end(), obs.begin(), obs.end());
  const std::vector<int32_t> tail = trusted(tok_, m_post + tmpl_.generation);
  ids.insert(ids.end(), tail.begin(), tail.end());
  if (static_cast<int64_t>(tr_.tokens.size() + ids.size()) >= lim_.max_total_tokens)
    return finish(true, "total_budget");
  force(ids, res.role == "tool" ? "tool" : "env", cut);
}

Trajectory expert_trajectory(const data::Tokenizer& tok, const std::string& env_name, uint64_t seed,
                             double noise, const EpisodeLimits& limits) {
  Episode ep(tok, agent_template(), env_name, seed, limits);
  data::Rng rng(seed ^ 0x5eedf00dull);
  while (!ep.finished()) {
    std::vector<int32_t> ids = tok.encode(ep.environment().expert(rng, noise));
    ids.push_back(ep.end_token());
    const auto budget = static_cast<size_t>(ep.turn_budget());
    if (ids.size() > budget) ids.resize(budget);
    ep.add_turn(ids);
  }
  return ep.take();
}

std::string expert_text(const std::string& env_name, uint64_t seed, double noise) {
  std::unique_ptr<Environment> env = make_environment(env_name);
  std::string text = env->reset(seed);
  for (const ToolSpec& s : env->tools()) {
    const json d = {{"name", s.name}, {"description", s.description}, {"parameters", s.parameters}};
    text.append("\n").append(d.dump());
  }
  data::Rng rng(seed ^ 0x5eedf00dull);
  for (int turn = 0; turn < env->max_turns() && !env->done(); ++turn) {
    const std::string msg = env->expert(rng, noise);
    text.append("\n").append(msg);
    const StepResult r = env->step(msg);
    if (!r.done) text.append("\n").append(r.observation);
  }
  return text;
}

}  // namespace myriad::agent
