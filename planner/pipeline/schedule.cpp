#include "planner/pipeline/schedule.h"

#include <algorithm>

namespace rannc::pipeline {

const char *scheduleName(Schedule s) {
  switch (s) {
  case Schedule::GPipe: return "gpipe";
  case Schedule::OneFOneB: return "1f1b";
  case Schedule::ZBH1: return "zb-h1";
  case Schedule::ZBH2: return "zb-h2";
  case Schedule::Interleaved1F1B: return "interleaved-1f1b";
  }
  return "?";
}

bool splitsBackward(Schedule s) { return s == Schedule::ZBH1 || s == Schedule::ZBH2; }

bool interleaves(Schedule s) { return s == Schedule::Interleaved1F1B; }

bool waitsForSendsBeforeBackward(Schedule s, int virtual_stages) {
  return s != Schedule::ZBH2 && !(interleaves(s) && virtual_stages > 1);
}

std::string interleavingProblem(Schedule s, int ranks, int virtual_stages, int microbatches) {
  if (virtual_stages < 1) return "--virtual-stages must be at least 1 (got " + std::to_string(virtual_stages) + ")";
  if (virtual_stages > 1 && !interleaves(s))
    return std::string(scheduleName(s)) + " runs one stage per rank: --virtual-stages " +
           std::to_string(virtual_stages) + " needs --schedule " + scheduleName(Schedule::Interleaved1F1B);
  if (virtual_stages > 1 && ranks > 0 && microbatches % ranks != 0)
    return std::string(scheduleName(s)) + " sends micro-batches through the chunks in groups of the " +
           std::to_string(ranks) + " pipeline ranks (Megatron-LM's schedule): the micro-batch count " +
           std::to_string(microbatches) + " must be a multiple of " + std::to_string(ranks);
  return "";
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

namespace {

/// Note [interleaved 1F1B]: rank `rank`'s passes, Megatron-LM's order.
std::vector<Pass> interleavedOrder(int rank, int ranks, int chunks, int microbatches) {
  const int p = ranks, v = chunks, total = v * microbatches;
  const int warmup = std::min(total, 2 * (p - rank - 1) + (v - 1) * p);
  auto pass = [&](int k, bool forward) {
    const int group = k % (p * v) / p;
    return Pass{forward, k / (p * v) * p + k % p, false, forward ? group : v - 1 - group};
  };
  std::vector<Pass> order;
  int next_f = 0, next_b = 0;
  for (; next_f < warmup; ++next_f) order.push_back(pass(next_f, true));
  while (next_f < total) {
    order.push_back(pass(next_f++, true));
    order.push_back(pass(next_b++, false));
  }
  while (next_b < total) order.push_back(pass(next_b++, false));
  return order;
}

/// Notes [zero bubble H1] and [zero bubble H2]: `warmup` forwards, then F
/// and B alternately, each B followed by the W `lag` B's behind it, then the
/// B's and the W's left over.
std::vector<Pass> splitOrder(int warmup, int lag, int microbatches) {
  std::vector<Pass> order;
  int next_f = 0, next_b = 0, next_w = 0;
  auto input = [&] {
    order.push_back({false, next_b++});
    if (next_b - next_w > lag) order.push_back({false, next_w++, true});
  };
  for (warmup = std::min(warmup, microbatches); next_f < warmup; ++next_f) order.push_back({true, next_f});
  while (next_f < microbatches) {
    order.push_back({true, next_f++});
    input();
  }
  while (next_b < microbatches) input();
  while (next_w < microbatches) order.push_back({false, next_w++, true});
  return order;
}

} // namespace

std::vector<Pass> rankOrder(Schedule s, int rank, int ranks, int virtual_stages, int microbatches) {
  if (interleaves(s) && virtual_stages > 1) return interleavedOrder(rank, ranks, virtual_stages, microbatches);
  return stageOrder(s, rank, ranks, microbatches);
}

std::vector<Pass> stageOrder(Schedule s, int stage, int num_stages, int microbatches) {
  std::vector<Pass> order;
  switch (s) {
  case Schedule::GPipe:
    // Fill-drain: every forward, then every backward, the newest first.
    for (int m = 0; m < microbatches; ++m) order.push_back({true, m});
    for (int m = microbatches - 1; m >= 0; --m) order.push_back({false, m});
    break;
  case Schedule::Interleaved1F1B: // one chunk per rank: Megatron's non-interleaved 1F1B
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
  case Schedule::ZBH1:
    // Note [zero bubble H1]: 1F1B's warm-up and alternation, each B followed
    // by the W `stage` B's behind it.
    order = splitOrder(num_stages - stage - 1, stage, microbatches);
    break;
  case Schedule::ZBH2:
    // Note [zero bubble H2]: twice ZB-H1's warm-up and twice its W lag.
    order = splitOrder(2 * (num_stages - stage - 1), 2 * stage, microbatches);
    break;
  }
  return order;
}

int microbatchesInFlight(Schedule s, int stage, int num_stages, int microbatches, int virtual_stages) {
  if (interleaves(s) && virtual_stages > 1) { // Note [interleaved 1F1B]: this chunk's peak on its rank's order
    const int ranks = num_stages / virtual_stages;
    int alive = 0, peak = 0;
    for (const Pass &p : rankOrder(s, stage % ranks, ranks, virtual_stages, microbatches))
      if (p.chunk == stage / ranks) peak = std::max(peak, alive += p.forward ? 1 : -1);
    return peak;
  }
  switch (s) {
  case Schedule::GPipe: return microbatches;
  case Schedule::Interleaved1F1B:
  case Schedule::OneFOneB: return std::min(microbatches, num_stages - stage); // the warm-up, plus one
  case Schedule::ZBH1: return std::min(microbatches, num_stages); // the warm-up, plus the `stage` W's held back, plus one
  case Schedule::ZBH2: return std::min(microbatches, 2 * num_stages - 1); // the same with both doubled
  }
  return microbatches;
}

int rankMicrobatchesInFlight(Schedule s, int rank, int ranks, int virtual_stages, int microbatches) {
  if (!interleaves(s) || virtual_stages == 1) return microbatchesInFlight(s, rank, ranks, microbatches);
  // Megatron's warm-up, plus the forward that starts the alternation.
  return std::min(virtual_stages * microbatches, 2 * (ranks - rank - 1) + (virtual_stages - 1) * ranks + 1);
}

int weightQueuePeak(Schedule s, int stage, int /*num_stages*/, int microbatches) {
  // The W lag (`stage` W's held back, 2 `stage` under ZB-H2), while B j runs min(j, lag) of them.
  const int lag = s == Schedule::ZBH2 ? 2 * stage : stage;
  return splitsBackward(s) ? std::max(0, std::min(microbatches - 1, lag)) : 0;
}

namespace {

/// Note [interleaved 1F1B]: with T_r the forward and backward slots of rank
/// r's chunks together and r* the first rank with the largest, the step is
/// M T_r* + (sum of all slots - T_r*) / v: with equal chunks
/// v M (f+b) + (p-1)(f+b), exact (the simulator's replay); otherwise an
/// estimate. With v = 1 it is 1F1B's classic form.
PipelineTime interleavedTime(const std::vector<StageSlots> &stages, int microbatches, int virtual_stages) {
  const int ranks = static_cast<int>(stages.size()) / virtual_stages;
  std::vector<double> per_rank(static_cast<size_t>(ranks), 0.0);
  double sum = 0;
  for (size_t i = 0; i < stages.size(); ++i) {
    const double fg = stages[i].forward_s + stages[i].backward_s;
    per_rank[i % static_cast<size_t>(ranks)] += fg;
    sum += fg;
  }
  PipelineTime t;
  const auto top = std::max_element(per_rank.begin(), per_rank.end());
  t.bottleneck_stage = static_cast<int>(top - per_rank.begin());
  t.fill_drain_s = *top + (sum - *top) / virtual_stages;
  t.steady_s = (microbatches - 1) * *top;
  return t;
}

} // namespace

PipelineTime pipelineTime(Schedule s, const std::vector<StageSlots> &stages, int microbatches, int virtual_stages) {
  if (interleaves(s) && virtual_stages > 1 && !stages.empty())
    return interleavedTime(stages, microbatches, virtual_stages);
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
  case Schedule::Interleaved1F1B: // one chunk per rank: 1F1B
  case Schedule::OneFOneB:
    // The classic form; exact for equal stages or M = 1 (Note [partition cost model]).
    t.steady_s = rest * std::max(max_fg, 0.0);
    break;
  case Schedule::ZBH2:
    // Note [zero bubble H2]: every stage but the last adds max(F, F+B-2W) to
    // the last stage's whole slot, B = G - W: with equal stages
    // M (F+B+W) + (S-1) max(F, F+B-2W). Exact for equal stages and
    // M >= 2S-1 (the simulator's replay); otherwise an estimate, and with
    // M < 2S-1 the warm-up never fills, so ZB-H1's form is kept.
    if (microbatches >= 2 * static_cast<int>(stages.size()) - 1 && !stages.empty()) {
      t.steady_s = rest * std::max(max_fg, 0.0);
      t.fill_drain_s = stages.back().forward_s + stages.back().backward_s;
      for (size_t i = 0; i + 1 < stages.size(); ++i) {
        const StageSlots &x = stages[i];
        t.fill_drain_s += std::max(x.forward_s, x.forward_s + x.backward_s - 3 * x.weight_s);
      }
      break;
    }
    [[fallthrough]];
  case Schedule::ZBH1:
    // Note [zero bubble H1]: 1F1B's form, less the W's that fill the drain:
    // every stage's W but the last stage's moves out of the fill and drain
    // into the bubbles, and every stage but the last is spared another W of
    // waiting, as B reaches it without W behind it. A stage never adds less
    // than its forward, which the last stage waits for: it adds max(F, F+B-W)
    // (F + G less min(G, 2W), B = G - W), so with equal stages
    // M (F+B+W) + (S-1) max(F, F+B-W). Exact for equal stages and M >= S
    // (the simulator's replay, W above or below B); otherwise an estimate,
    // and with M < S the stages never reach the steady state, so 1F1B's form
    // is kept.
    t.steady_s = rest * std::max(max_fg, 0.0);
    if (microbatches >= static_cast<int>(stages.size()))
      for (size_t i = 0; i + 1 < stages.size(); ++i)
        t.fill_drain_s -= std::min(stages[i].backward_s, 2 * stages[i].weight_s);
    break;
  }
  return t;
}

} // namespace rannc::pipeline
