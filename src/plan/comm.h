// Communication per device and optimiser step for a training layout, and the time it takes on
// the hardware's links. Ranks are placed cp innermost, then dp, then pp; an EP group is ep
// consecutive ranks of the dp·cp block. A collective stays on NVLink when its ranks share a
// node, else it runs at the per-GPU network bandwidth.
#pragma once
#include <string>
#include <vector>

#include "plan/memory.h"

namespace myriad::plan {

struct CommItem {
  std::string name;      // dp_reduce_scatter, ep_dispatch, cp_kda_scan, ...
  std::string what;      // one line: what moves
  int64_t group = 1;     // ranks taking part
  bool network = false;  // crosses nodes
  double bytes = 0;      // sent per device per step
  double seconds = 0;    // on the link, before overlap
  double exposed = 0;    // not hidden behind compute
};

struct CommBreakdown {
  std::vector<CommItem> items;
  double bytes = 0, seconds = 0, exposed = 0;
};

// The share of EP all-to-all time assumed hidden behind expert compute (two micro-batches in
// ping-pong, as DeepSeek-V3 does); DP collectives hide behind backward compute up to its length.
constexpr double kEpOverlap = 0.5;

// backward_seconds: the backward compute time per step, which DP traffic can hide behind.
CommBreakdown training_comm(const ModelConfig& c, const ParamCounts& pc, const Hardware& hw,
                            const TrainSetup& s, double backward_seconds);

// Seconds for a ring all-gather or reduce-scatter in which each rank sends `bytes`, over g
// ranks spaced `stride` apart; and for an all-to-all in which each rank sends `bytes` spread
// evenly over the other g - 1 ranks.
double ring_seconds(const Hardware& hw, double bytes, int64_t g, int64_t stride);
double all_to_all_seconds(const Hardware& hw, double bytes, int64_t g);

}  // namespace myriad::plan
