// Step reporting: what one step's schedule interpretation measured on this
// rank, its reduction over all ranks, and rank 0's JSON line (SPEC's --log
// keys and more), progress line and final summary.
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/schedule/schedule.h"
#include "executor/train/trainer.h"
#include "planner/ir/ir.h"
#include "planner/support/status.h"

namespace rannc::train {

class GradientBuckets;

/// Where a rank's step time goes (logged per stage as `stage_times_s`).
enum Phase { kForward, kBackward, kComm, kUpdate, kPhases };
inline const char *const kPhaseNames[kPhases] = {"forward_s", "backward_s", "comm_s", "update_s"};

/// The phase an action's time counts in.
Phase phaseOf(schedule::ActionKind k);

/// Seconds from `t` to now.
double secondsSince(std::chrono::steady_clock::time_point t);

/// Tokens per sample of a sequence model: the non-batch size of the first
/// integer data input of rank >= 2 (token ids [B, S]); 0 when there is none.
int64_t tokensPerSample(const ir::Graph &g);

/// "1h02m", "3m05s", "42s": an ETA for people.
std::string formatEta(double seconds);

/// One step as this rank's schedule interpreter saw it.
struct StepRecord {
  int64_t step = 0;
  double loss_sum = 0;              ///< this rank's share of the step's mean loss (the loss stage only)
  std::vector<double> batch_losses; ///< each accumulated batch's loss share
  std::array<double, kPhases> phase_s{};
  double step_time_s = 0;
  double lr = 0;
  double grad_norm = 0;
  bool skipped = false;
};

/// A step's figures from every rank, as rank 0 reports them.
struct StepTotals {
  double loss = 0;                                  ///< the global batch's loss
  std::vector<int64_t> peak_memory_bytes;           ///< per rank
  std::vector<int64_t> peak_rss_bytes;              ///< per rank
  std::vector<std::array<double, kPhases>> phase_s; ///< per rank
};

/// What a step's JSON line says besides the step's own figures.
struct StepContext {
  std::vector<std::vector<int>> ranks_of; ///< every stage's ranks
  int64_t samples_per_step = 0;           ///< K x B
  int64_t tokens_per_sample = 0;
  /// Rank 0's replica all-reduce buckets: started during backward, of all (none: no replicas).
  std::optional<std::pair<int64_t, int64_t>> buckets_overlapped;
};

/// The --log line of step `r` (its time and batch losses already reduced
/// over the ranks): SPEC's keys `step, loss, samples_per_s, step_time_s,
/// peak_memory_bytes, peak_memory_bytes_per_rank`, then the rest.
nlohmann::ordered_json stepJson(const StepRecord &r, const StepTotals &t, const StepContext &c);

/// A step's reductions over all ranks and rank 0's reporting of them: the
/// JSON line (SPEC's log keys and more), the progress line, the run's summary.
class StepReporter {
public:
  struct Context {
    const TrainOptions &opts;
    comm::Communicator &comm;
    const std::vector<std::vector<int>> &ranks_of; ///< every stage's ranks
    int64_t samples_per_step = 0;                  ///< K x B
    int64_t tokens_per_sample = 0;
    bool computes_loss = false;                    ///< this rank's stage computes the loss
    int64_t first_step = 0, steps = 0;
    int gpu = -1;                                  ///< this rank's CUDA device (-1: CPU)
  };

  StepReporter(Context c, std::ostream &log) : c_(std::move(c)), log_(log) {}

  /// Opens the --log file on rank 0: appended to when resuming.
  Status open();

  /// Reduces `r` over the ranks and reports it; an error (said by rank 0) for a
  /// non-finite loss under --on-nonfinite stop.
  Status report(StepRecord r, const GradientBuckets *buckets);

  /// Rank 0's final line: steps, time, throughput, loss, peak memory.
  void summary() const;

private:
  Context c_;
  std::ostream &log_;
  std::ofstream jsonl_;
  double run_time_ = 0, last_loss_ = 0;
  int64_t samples_done_ = 0, peak_memory_ = 0;
};

} // namespace rannc::train
