#include "executor/train/step_report.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <cerrno>
#include <cstring>
#include <cstdio>
#include <iostream>

#include "executor/runtime/device.h"
#include "executor/runtime/memory.h"
#include "executor/train/buckets.h"

namespace rannc::train {
namespace {

int64_t peakRssBytes() {
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  return int64_t(ru.ru_maxrss) * 1024; // Linux reports KiB
}

} // namespace

Phase phaseOf(schedule::ActionKind k) {
  switch (k) {
  case schedule::ActionKind::Forward: return kForward;
  case schedule::ActionKind::Backward:
  case schedule::ActionKind::BackwardWeight: return kBackward;
  case schedule::ActionKind::OptimizerStep: return kUpdate;
  default: return kComm;
  }
}

double secondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int64_t tokensPerSample(const ir::Graph &g) {
  for (ir::ValueId in : g.inputs) {
    const ir::Value &v = g.values[in];
    if (ir::isFloating(v.dtype) || v.shape.size() < 2) continue;
    int64_t n = 1;
    for (size_t d = 1; d < v.shape.size(); ++d) n *= v.shape[d].isFixed() ? v.shape[d].offset : 0;
    if (n > 0) return n;
  }
  return 0;
}

std::string formatEta(double seconds) {
  const int64_t t = int64_t(seconds + 0.5);
  char buf[32];
  if (t >= 3600) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)(t / 3600), (long long)(t % 3600 / 60));
  else if (t >= 60) std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)(t / 60), (long long)(t % 60));
  else std::snprintf(buf, sizeof buf, "%llds", (long long)t);
  return buf;
}

nlohmann::ordered_json stepJson(const StepRecord &r, const StepTotals &t, const StepContext &c) {
  const size_t K = r.batch_losses.size();
  nlohmann::ordered_json j;
  j["step"] = r.step;
  j["loss"] = t.loss;
  j["samples_per_s"] = double(c.samples_per_step) / r.step_time_s;
  if (c.tokens_per_sample > 0) j["tokens_per_s"] = double(c.samples_per_step * c.tokens_per_sample) / r.step_time_s;
  j["step_time_s"] = r.step_time_s;
  j["peak_memory_bytes"] = *std::max_element(t.peak_memory_bytes.begin(), t.peak_memory_bytes.end());
  j["peak_memory_bytes_per_rank"] = t.peak_memory_bytes;
  j["peak_rss_bytes"] = *std::max_element(t.peak_rss_bytes.begin(), t.peak_rss_bytes.end());
  j["lr"] = r.lr;
  j["grad_norm"] = r.grad_norm;
  if (K > 1) j["batch_losses"] = r.batch_losses;
  // Per stage, the slowest of its ranks in each phase: compute, waiting
  // for and sending to other stages and replicas, the optimizer update.
  nlohmann::ordered_json stage_times = nlohmann::ordered_json::array();
  for (size_t st = 0; st < c.ranks_of.size(); ++st) {
    nlohmann::ordered_json times;
    times["stage"] = st;
    for (int k = 0; k < kPhases; ++k) {
      double worst = 0;
      for (int rk : c.ranks_of[st]) worst = std::max(worst, t.phase_s[size_t(rk)][size_t(k)]);
      times[kPhaseNames[k]] = worst;
    }
    stage_times.push_back(times);
  }
  j["stage_times_s"] = stage_times;
  if (const auto &b = c.buckets_overlapped) j["allreduce_buckets_overlapped"] = {b->first, b->second};
  if (r.skipped) j["skipped"] = true;
  return j;
}

Status StepReporter::open() {
  if (c_.comm.rank() != 0 || c_.opts.log.empty()) return Status::success();
  jsonl_.open(c_.opts.log, c_.first_step > 0 ? std::ios::app : std::ios::trunc);
  if (!jsonl_) return Error{c_.opts.log + ": cannot write the log"};
  return Status::success();
}

Status StepReporter::report(StepRecord r, const GradientBuckets *buckets) {
  comm::Communicator &comm = c_.comm;
  const int world = comm.size(), rank = comm.rank();
  const int64_t K = int64_t(r.batch_losses.size());
  // Loss from the stage that computes it; memory per rank; slowest rank's time.
  std::vector<double> sums(1 + (2 + kPhases) * world, 0.0);
  sums[0] = c_.computes_loss ? r.loss_sum : 0.0;
  // Tensor memory: the counting allocator's on CPU, the caching allocator's on a GPU.
  sums[1 + rank] = double(c_.gpu >= 0 ? runtime::gpuPeakAllocatedBytes(c_.gpu) : runtime::peakTensorBytes());
  sums[1 + world + rank] = double(peakRssBytes());
  for (int k = 0; k < kPhases; ++k) sums[1 + (2 + k) * world + rank] = r.phase_s[size_t(k)];
  comm.allReduce(sums.data(), int(sums.size()), comm::ReduceOp::Sum);
  comm.allReduce(&r.step_time_s, 1, comm::ReduceOp::Max);
  if (K > 1) comm.allReduce(r.batch_losses.data(), int(K), comm::ReduceOp::Sum);
  const double loss = sums[0];
  if (!std::isfinite(loss) && c_.opts.on_nonfinite == "stop")
    return Error{rank == 0 ? "non-finite loss (" + std::to_string(loss) + ") at step " + std::to_string(r.step) : ""};
  if (rank != 0) return Status::success();
  StepTotals totals;
  totals.loss = loss;
  totals.peak_memory_bytes.assign(sums.begin() + 1, sums.begin() + 1 + world);
  totals.peak_rss_bytes.assign(sums.begin() + 1 + world, sums.begin() + 1 + 2 * world);
  totals.phase_s.resize(size_t(world));
  for (int rk = 0; rk < world; ++rk)
    for (int k = 0; k < kPhases; ++k) totals.phase_s[size_t(rk)][size_t(k)] = sums[size_t(1 + (2 + k) * world + rk)];
  StepContext context{c_.ranks_of, c_.samples_per_step, c_.tokens_per_sample, std::nullopt};
  // Rank 0's replica all-reduce: buckets started during backward, of all.
  if (buckets) context.buckets_overlapped = {buckets->startedEarly(), int64_t(buckets->size())};
  const nlohmann::ordered_json j = stepJson(r, totals, context);
  if (jsonl_.is_open()) {
    jsonl_ << j.dump() << "\n" << std::flush;
    // A full disk must stop the run, not cut the log short unnoticed (rank 0 only: the job aborts).
    if (!jsonl_) throw std::runtime_error(c_.opts.log + ": cannot write the log at step " + std::to_string(r.step) +
                                          ": " + std::strerror(errno));
  }
  run_time_ += r.step_time_s;
  samples_done_ += c_.samples_per_step;
  last_loss_ = loss;
  peak_memory_ = std::max(peak_memory_, j["peak_memory_bytes"].get<int64_t>());
  if (c_.opts.progress) {
    // On a terminal one line rewritten in place; otherwise a line per step.
    const bool tty = &log_ == &std::cerr && ::isatty(STDERR_FILENO);
    const double eta = run_time_ / double(r.step + 1 - c_.first_step) * double(c_.steps - r.step - 1);
    char line[160];
    std::snprintf(line, sizeof line, "step %lld/%lld  loss %.6g  %.1f samples/s  ETA %s", (long long)(r.step + 1),
                  (long long)c_.steps, loss, double(c_.samples_per_step) / r.step_time_s, formatEta(eta).c_str());
    log_ << line << (tty ? (r.step + 1 == c_.steps ? "\n" : "\r") : "\n") << std::flush;
  }
  return Status::success();
}

void StepReporter::summary() const {
  if (c_.comm.rank() != 0 || c_.steps <= c_.first_step) return;
  char line[200];
  std::snprintf(line, sizeof line,
                "rannc-exec: done: %lld step(s) in %.3g s, %.1f samples/s, final loss %.6g, peak tensor memory "
                "%.1f MiB per rank",
                (long long)(c_.steps - c_.first_step), run_time_, double(samples_done_) / std::max(run_time_, 1e-12),
                last_loss_, double(peak_memory_) / (1 << 20));
  log_ << line << "\n";
}

} // namespace rannc::train
