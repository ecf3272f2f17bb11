// "gridworld" (TRAINING.md §8.3): a random 5×5 map with start S, goal G, holes H, walls # and
// floor '.', redrawn from the seed until the goal is reachable from S at a BFS distance from 2 to
// 10 (so that it can be reached within the turn limit). Each observation (role "user") is the five
// rows with the agent drawn as '@', then "pos R,C". An action is an assistant message that is
// exactly U, D, L or R (trimmed); anything else is a tool error (no move, -0.05). Process reward
// 0.1·(d_prev − d_new) with d the BFS distance to G (holes impassable), −0.05 for bumping into a
// wall or the edge. Terminal: R = 1 on reaching G; a hole or running out of turns (min(10, 2 ×
// shortest path)) ends with R = 0. The expert takes a BFS-optimal action, replaced by a uniformly
// random one with probability `noise` per turn.
#include <array>
#include <vector>

#include "agent/environment.h"
#include "core/error.h"

namespace myriad::agent {
namespace {

constexpr int kSide = 5, kCells = kSide * kSide;
constexpr std::array<char, 4> kActions = {'U', 'D', 'L', 'R'};
constexpr std::array<int, 4> kDr = {-1, 1, 0, 0}, kDc = {0, 0, -1, 1};

class Gridworld final : public Environment {
 public:
  std::string name() const override { return "gridworld"; }

  std::string reset(uint64_t seed) override {
    const bool heldout = seed >= kHeldoutSeedBase;
    data::Rng rng(seed);
    std::string first;
    do {
      do draw(rng);
      while (dist_[start_] < 2 || dist_[start_] > 10);  // unreachable (-1), adjacent, too far
      pos_ = start_;
      first = observation();
    } while (heldout_task(first) != heldout);
    turns_ = 0;
    reward_ = 0;
    started_ = true;
    done_ = false;
    return first;
  }

  StepResult step(const std::string& message) override {
    MYRIAD_CHECK(started_ && !done_, "gridworld: step() needs a running episode (call reset)");
    ++turns_;
    StepResult res;
    res.role = "user";
    const int a = action_index(trim(message));
    if (a < 0) {
      res.tool_error = true;
      res.process_reward = -0.05;
    } else {
      const int r = pos_ / kSide + kDr[static_cast<size_t>(a)];
      const int c = pos_ % kSide + kDc[static_cast<size_t>(a)];
      if (r < 0 || r >= kSide || c < 0 || c >= kSide || grid_[r * kSide + c] == '#') {
        res.process_reward = -0.05;  // a bump: no move
      } else {
        const int prev = dist_[pos_];
        pos_ = r * kSide + c;
        if (grid_[pos_] == 'H') {
          done_ = true;  // R = 0
        } else {
          res.process_reward = 0.1 * (prev - dist_[pos_]);
          if (grid_[pos_] == 'G') {
            reward_ = 1;
            done_ = true;
          }
        }
      }
    }
    if (turns_ >= max_turns()) done_ = true;  // out of turns: R stays 0 unless G was reached
    res.done = done_;
    if (!done_) res.observation = observation();
    return res;
  }

  bool done() const override { return done_; }
  double terminal_reward() const override { return reward_; }
  bool solved() const override { return done_ && reward_ >= 1.0; }
  int max_turns() const override { return std::min(10, 2 * dist_[start_]); }
  std::vector<ToolSpec> tools() const override { return {}; }

  std::string expert(data::Rng& rng, double noise) const override {
    MYRIAD_CHECK(started_ && !done_, "gridworld: expert() needs a running episode");
    size_t best = 0;
    for (size_t a = 0; a < kActions.size(); ++a) {
      const int r = pos_ / kSide + kDr[a], c = pos_ % kSide + kDc[a];
      if (r >= 0 && r < kSide && c >= 0 && c < kSide && dist_[r * kSide + c] == dist_[pos_] - 1) {
        best = a;
        break;
      }
    }
    if (rng.uniform() < noise) best = rng.below(kActions.size());
    return std::string(1, kActions[best]);
  }

 private:
  std::array<char, kCells> grid_{};  // S G H # .
  std::array<int, kCells> dist_{};   // BFS distance to G over non-wall, non-hole cells; -1: none
  int start_ = 0, pos_ = 0, turns_ = 0;
  double reward_ = 0;
  bool started_ = false, done_ = false;

  static int action_index(const std::string& s) {
    for (size_t a = 0; a < kActions.size(); ++a)
      if (s.size() == 1 && s[0] == kActions[a]) return static_cast<int>(a);
    return -1;
  }

  // One random map: S, G, 2–5 walls and 2–4 holes on distinct cells; then the BFS distances.
  void draw(data::Rng& rng) {
    std::vector<int> cells(kCells);
    for (int i = 0; i < kCells; ++i) cells[static_cast<size_t>(i)] = i;
    rng.shuffle(cells);
    grid_.fill('.');
    const size_t walls = 2 + rng.below(4), holes = 2 + rng.below(3);
    start_ = cells[0];
    grid_[static_cast<size_t>(cells[0])] = 'S';
    grid_[static_cast<size_t>(cells[1])] = 'G';
    for (size_t i = 0; i < walls + holes; ++i)
      grid_[static_cast<size_t>(cells[2 + i])] = i < walls ? '#' : 'H';
    dist_.fill(-1);
    std::vector<int> queue = {cells[1]};
    dist_[static_cast<size_t>(cells[1])] = 0;
    for (size_t q = 0; q < queue.size(); ++q) {
      const int p = queue[q];
      for (size_t a = 0; a < kActions.size(); ++a) {
        const int r = p / kSide + kDr[a], c = p % kSide + kDc[a];
        if (r < 0 || r >= kSide || c < 0 || c >= kSide) continue;
        const size_t n = static_cast<size_t>(r * kSide + c);
        if (dist_[n] >= 0 || grid_[n] == '#' || grid_[n] == 'H') continue;
        dist_[n] = dist_[static_cast<size_t>(p)] + 1;
        queue.push_back(static_cast<int>(n));
      }
    }
  }

  std::string observation() const {
    std::string s;
    for (int r = 0; r < kSide; ++r) {
      for (int c = 0; c < kSide; ++c) {
        const int i = r * kSide + c;
        s += i == pos_ ? '@' : grid_[static_cast<size_t>(i)];
      }
      s += '\n';
    }
    return s + "pos " + std::to_string(pos_ / kSide) + "," + std::to_string(pos_ % kSide);
  }
};

}  // namespace

MYRIAD_REGISTER_ENVIRONMENT("gridworld", Gridworld);

}  // namespace myriad::agent
