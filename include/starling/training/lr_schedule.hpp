// The learning-rate schedule of the built-in tasks: linear warm-up, then cosine decay to a
// fraction of the peak. A function of the collaboration's epoch (the number of optimizer steps
// the collaboration took), so every peer uses the same rate at the same step, joiners and
// restarted peers included. No torch here.
//
// Threading rule: plain values and a pure function.
#pragma once

#include <cmath>
#include <cstdint>
#include <numbers>

namespace starling::training {

struct LrSchedule {
  double peak = 1e-3;
  std::uint64_t warmup_epochs = 0;  // linear from peak / warmup to peak over these steps
  std::uint64_t total_epochs = 0;   // cosine decay ends here (0: constant after warm-up)
  double final_ratio = 0.1;         // the rate at and after total_epochs, times peak
};

// The rate of the step that takes the collaboration from `epoch` to `epoch + 1`.
inline double lr_at(const LrSchedule& s, std::uint64_t epoch) {
  if (epoch < s.warmup_epochs)
    return s.peak * static_cast<double>(epoch + 1) / static_cast<double>(s.warmup_epochs);
  if (s.total_epochs <= s.warmup_epochs) return s.peak;
  if (epoch >= s.total_epochs) return s.peak * s.final_ratio;
  const double t = static_cast<double>(epoch - s.warmup_epochs) /
                   static_cast<double>(s.total_epochs - s.warmup_epochs);
  const double cosine = 0.5 * (1 + std::cos(std::numbers::pi * t));
  return s.peak * (s.final_ratio + (1 - s.final_ratio) * cosine);
}

}  // namespace starling::training
