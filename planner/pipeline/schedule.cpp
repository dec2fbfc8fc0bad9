#include "planner/pipeline/schedule.h"

#include <algorithm>

namespace rannc::pipeline {

const char *scheduleName(Schedule s) {
  switch (s) {
  case Schedule::GPipe: return "gpipe";
  case Schedule::OneFOneB: return "1f1b";
  }
  return "?";
}

std::string scheduleChoices(const char *(*name)(Schedule)) {
  std::string out;
  for (size_t i = 0; i < kSchedules.size(); ++i)
    out += (i == 0 ? "" : i + 1 == kSchedules.size() ? " or " : ", ") + std::string(name(kSchedules[i]));
  return out;
}

Expected<Schedule> parseSchedule(std::string_view name) {
  for (Schedule s : kSchedules)
    if (name == scheduleName(s)) return s;
  return Error{"must be " + scheduleChoices() + " (got '" + std::string(name) + "')"};
}

std::vector<Pass> stageOrder(Schedule s, int stage, int num_stages, int microbatches) {
  std::vector<Pass> order;
  switch (s) {
  case Schedule::GPipe:
    // Fill-drain: every forward, then every backward, the newest first.
    for (int m = 0; m < microbatches; ++m) order.push_back({true, m});
    for (int m = microbatches - 1; m >= 0; --m) order.push_back({false, m});
    break;
  case Schedule::OneFOneB: {
    // PipeDream-flush: warm up with enough forwards to fill the stages after
    // this one, then alternate one forward and one backward, then drain.
    const int warmup = std::min(num_stages - stage - 1, microbatches);
    int next_f = 0, next_b = 0;
    for (; next_f < warmup; ++next_f) order.push_back({true, next_f});
    while (next_f < microbatches) {
      order.push_back({true, next_f++});
      order.push_back({false, next_b++});
    }
    while (next_b < microbatches) order.push_back({false, next_b++});
    break;
  }
  }
  return order;
}

int microbatchesInFlight(Schedule s, int stage, int num_stages, int microbatches) {
  switch (s) {
  case Schedule::GPipe: return microbatches;
  case Schedule::OneFOneB: return std::min(microbatches, num_stages - stage); // the warm-up, plus one
  }
  return microbatches;
}

PipelineTime pipelineTime(Schedule s, const std::vector<StageSlots> &stages, int microbatches) {
  double sum_f = 0, sum_g = 0, max_f = 0, max_g = 0, max_fg = -1;
  PipelineTime t;
  for (size_t i = 0; i < stages.size(); ++i) {
    const double f = stages[i].forward_s, g = stages[i].backward_s;
    sum_f += f;
    sum_g += g;
    max_f = std::max(max_f, f);
    max_g = std::max(max_g, g);
    if (f + g > max_fg) {
      max_fg = f + g;
      t.bottleneck_stage = static_cast<int>(i);
    }
  }
  const double rest = microbatches - 1;
  t.fill_drain_s = sum_f + sum_g;
  switch (s) {
  case Schedule::GPipe:
    // Two flow shops of identical jobs, forwards then backwards, each lasting
    // sum(slot) + (M-1) max(slot).
    t.steady_s = rest * (max_f + max_g);
    break;
  case Schedule::OneFOneB:
    // The classic form; exact for equal stages or M = 1 (Note [partition cost model]).
    t.steady_s = rest * std::max(max_fg, 0.0);
    break;
  }
  return t;
}

} // namespace rannc::pipeline
