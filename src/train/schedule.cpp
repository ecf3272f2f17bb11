#include "train/schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "core/error.h"

namespace myriad::train {

double lr_at(const Schedule& s, int64_t step) {
  MYRIAD_CHECK(s.warmup >= 0 && step >= 0, "lr_at: negative warmup ", s.warmup, " or step ", step);
  if (step < s.warmup) return s.peak * static_cast<double>(step) / static_cast<double>(s.warmup);
  if (s.kind == "constant") return s.peak;
  const double lo = s.min_ratio * s.peak;
  MYRIAD_CHECK(s.total > s.warmup, "lr_at: ", s.kind, " needs total (", s.total, ") > warmup (",
               s.warmup, ")");
  if (step >= s.total) return lo;
  if (s.kind == "cosine") {
    const double f = static_cast<double>(step - s.warmup) / static_cast<double>(s.total - s.warmup);
    return lo + 0.5 * (s.peak - lo) * (1 + std::cos(std::numbers::pi * f));
  }
  MYRIAD_CHECK(s.kind == "wsd", "lr_at: unknown schedule kind '", s.kind, "'");
  MYRIAD_CHECK(s.decay_shape == "1-sqrt" || s.decay_shape == "linear",
               "lr_at: unknown WSD decay_shape '", s.decay_shape, "'");
  const int64_t D = s.decay_steps > 0 ? s.decay_steps : std::max<int64_t>(1, s.total / 10);
  MYRIAD_CHECK(D <= s.total - s.warmup, "lr_at: WSD decay_steps ", D, " overlap the warm-up (",
               s.warmup, " of ", s.total, ")");
  const int64_t start = s.total - D;
  if (step < start) return s.peak;
  const double f = static_cast<double>(step - start) / static_cast<double>(D);
  return lo + (s.peak - lo) * (s.decay_shape == "linear" ? 1 - f : 1 - std::sqrt(f));
}

}  // namespace myriad::train
