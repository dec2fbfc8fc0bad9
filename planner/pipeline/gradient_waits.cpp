#include "planner/pipeline/gradient_waits.h"

#include <algorithm>
#include <string>

namespace rannc::pipeline {

Expected<std::vector<std::vector<std::vector<SentGradient>>>>
awaitedGradients(const std::vector<std::vector<Pass>> &orders, const std::vector<std::vector<int>> &producers) {
  const int ranks = static_cast<int>(orders.size());
  int chunks = 1, microbatches = 0;
  bool split = false;
  for (const auto &order : orders)
    for (const Pass &p : order) {
      chunks = std::max(chunks, p.chunk + 1);
      microbatches = std::max(microbatches, p.microbatch + 1);
      split = split || p.weight;
    }
  const int S = ranks * chunks;
  auto stageOf = [&](int r, const Pass &p) { return p.chunk * ranks + r; };

  // The replay (Note [awaited gradient sends]): -1 until a pass has run.
  std::vector<std::vector<int>> fwd_end(S, std::vector<int>(microbatches, -1)), bwd_start = fwd_end, bwd_end = fwd_end;
  std::vector<std::vector<int>> start(ranks);
  std::vector<int> free_at(ranks, 0);
  std::vector<size_t> cursor(ranks, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int r = 0; r < ranks; ++r)
      for (; cursor[r] < orders[r].size(); ++cursor[r]) {
        const Pass &p = orders[r][cursor[r]];
        const int s = stageOf(r, p), mb = p.microbatch;
        int ready = 0, takes = 1; // a forward, or a split backward's W
        if (p.forward && !p.weight) {
          ready = s > 0 ? fwd_end[s - 1][mb] : 0;
        } else if (!p.weight) {
          ready = s < S - 1 ? bwd_end[s + 1][mb] : fwd_end[s][mb];
          takes = split ? 1 : 2;
        }
        if (ready < 0) break;
        const int t = std::max(free_at[r], ready);
        start[r].push_back(t);
        free_at[r] = t + takes;
        moved = true;
        if (p.weight) continue;
        if (p.forward) {
          fwd_end[s][mb] = free_at[r];
        } else {
          bwd_start[s][mb] = t;
          bwd_end[s][mb] = free_at[r];
        }
      }
  }
  for (int r = 0; r < ranks; ++r)
    if (cursor[r] != orders[r].size())
      return Error{"the pipeline orders deadlock: pipeline rank " + std::to_string(r) + " stops at pass " +
                   std::to_string(cursor[r]) + " of " + std::to_string(orders[r].size())};

  // When the last producer of stage s took micro-batch mb's gradient in.
  auto takenIn = [&](const SentGradient &g) {
    const bool chain = producers.empty() || producers[static_cast<size_t>(g.stage)].empty();
    if (chain) return bwd_start[g.stage - 1][g.microbatch];
    int t = 0;
    for (int p : producers[static_cast<size_t>(g.stage)]) t = std::max(t, bwd_start[p][g.microbatch]);
    return t;
  };
  std::vector<std::vector<std::vector<SentGradient>>> waits(ranks);
  for (int r = 0; r < ranks; ++r) {
    waits[r].resize(orders[r].size());
    std::vector<SentGradient> unawaited;
    for (size_t i = 0; i < orders[r].size(); ++i) {
      const Pass &p = orders[r][i];
      if (p.forward || p.weight) continue;
      std::vector<SentGradient> &now = waits[r][i];
      std::erase_if(unawaited, [&](const SentGradient &g) {
        const bool taken = takenIn(g) <= start[r][i];
        if (taken) now.push_back(g);
        return taken;
      });
      if (const int s = stageOf(r, p); s > 0) unawaited.push_back({s, p.microbatch});
    }
  }
  return waits;
}

std::vector<std::vector<std::vector<int>>> inFlightGradients(Schedule s, int ranks, int virtual_stages,
                                                             int microbatches) {
  std::vector<std::vector<Pass>> orders(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) orders[r] = rankOrder(s, r, ranks, virtual_stages, microbatches);
  auto waits = awaitedGradients(orders);
  std::vector<std::vector<std::vector<int>>> held(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    const std::vector<Pass> &mine = orders[static_cast<size_t>(r)];
    held[r].assign(mine.size(), std::vector<int>(static_cast<size_t>(virtual_stages), 0));
    if (!waits) continue; // rankOrder's orders never deadlock (agreement_test replays them)
    std::vector<int> now(static_cast<size_t>(virtual_stages), 0);
    for (size_t i = 0; i < mine.size(); ++i) {
      for (const SentGradient &g : (*waits)[static_cast<size_t>(r)][i]) --now[static_cast<size_t>(g.stage / ranks)];
      held[r][i] = now;
      const Pass &p = mine[i];
      if (!p.forward && !p.weight && p.chunk * ranks + r > 0) ++now[static_cast<size_t>(p.chunk)];
    }
  }
  return held;
}

} // namespace rannc::pipeline
