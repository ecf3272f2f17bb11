// Rollouts through the inference engine: see rollout.h.
#include "agent/rollout.h"

#include <condition_variable>
#include <deque>
#include <mutex>
#include <optional>

#include "core/error.h"

namespace myriad::agent {
namespace {

// What the engine thread hands back for one turn.
struct TurnResult {
  size_t episode = 0;
  std::vector<int32_t> tokens;
  std::vector<float> logps;
  std::string error;
};

}  // namespace

std::vector<Trajectory> rollout(infer::Engine& engine, const data::Tokenizer& tok,
                                const serve::ChatTemplate& tmpl,
                                const std::vector<RolloutTask>& tasks, const RolloutConfig& cfg) {
  std::vector<std::optional<Episode>> eps(tasks.size());
  std::vector<int64_t> turn(tasks.size(), 0);
  std::vector<TurnResult> partial(tasks.size());
  std::mutex mu;
  std::condition_variable cv;
  std::deque<TurnResult> done;
  size_t open = 0;

  const auto submit = [&](size_t i) {
    const Episode& ep = *eps[i];
    infer::Request rq;
    rq.prompt = ep.trajectory().tokens;
    rq.params.temperature = cfg.temperature;
    rq.params.max_tokens = ep.turn_budget();
    rq.params.stop_tokens = {ep.end_token()};
    rq.params.top_logprobs = 0;
    rq.params.seed = mix_seed(mix_seed(cfg.seed, i), static_cast<uint64_t>(turn[i]));
    {
      std::lock_guard lk(mu);
      partial[i] = TurnResult{i, {}, {}, ""};
    }
    engine.submit(std::move(rq), [&, i](const infer::TokenEvent& ev) {
      std::lock_guard lk(mu);
      TurnResult& r = partial[i];
      if (ev.token >= 0) {
        r.tokens.push_back(ev.token);
        r.logps.push_back(static_cast<float>(ev.logprob));
      }
      if (ev.finished) {
        if (ev.finish_reason == "error" || ev.finish_reason == "cancelled")
          r.error = ev.finish_reason + ": " + ev.error;
        done.push_back(std::move(r));
        cv.notify_one();
      }
      return true;
    });
  };

  for (size_t i = 0; i < tasks.size(); ++i) {
    eps[i].emplace(tok, tmpl, tasks[i].env, tasks[i].seed, cfg.limits);
    submit(i);
    ++open;
  }
  while (open > 0) {
    TurnResult r;
    {
      std::unique_lock lk(mu);
      cv.wait(lk, [&] { return !done.empty(); });
      r = std::move(done.front());
      done.pop_front();
    }
    MYRIAD_CHECK(r.error.empty(), "rollout: the engine failed a turn of task ", r.episode, ": ",
                 r.error);
    MYRIAD_CHECK(!r.tokens.empty(), "rollout: the engine returned an empty turn");
    Episode& ep = *eps[r.episode];
    ep.add_turn(r.tokens, r.logps);
    ++turn[r.episode];
    if (ep.finished())
      --open;
    else
      submit(r.episode);
  }
  std::vector<Trajectory> out;
  out.reserve(tasks.size());
  for (size_t i = 0; i < tasks.size(); ++i) {
    Trajectory t = eps[i]->take();
    t.task_id = tasks[i].task_id;
    t.group_id = tasks[i].group_id;
    t.policy_version = cfg.policy_version;
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace myriad::agent
