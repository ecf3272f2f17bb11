// Learning-rate schedules of TRAINING.md §1.5. Steps count from 0; warm-up is linear from 0
// (η = peak · t / W for t < W), so η(W) = peak. Cosine and WSD reach η_min = min_ratio · peak
// at t = total and stay there; constant stays at peak.
#pragma once
#include <cstdint>
#include <string>

namespace myriad::train {

struct Schedule {
  std::string kind = "wsd";  // "wsd", "cosine" or "constant"
  double peak = 0, min_ratio = 0.1;
  int64_t warmup = 0, total = 0;
  int64_t decay_steps = 0;             // WSD decay length D; 0 means total / 10
  std::string decay_shape = "1-sqrt";  // WSD: "1-sqrt" or "linear"
};

double lr_at(const Schedule& s, int64_t step);

}  // namespace myriad::train
