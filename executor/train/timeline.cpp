#include "executor/train/timeline.h"

#include <sstream>

#include "executor/runtime/cpu_clock.h"
#include "executor/runtime/device.h"
#include "executor/runtime/memory.h"
#include "planner/support/files.h"

namespace rannc::train {

plan::TraceKind traceKindOf(schedule::ActionKind k) {
  switch (k) {
  case schedule::ActionKind::RecvActivations: return plan::TraceKind::RecvActivations;
  case schedule::ActionKind::Forward: return plan::TraceKind::Forward;
  case schedule::ActionKind::SendActivations: return plan::TraceKind::SendActivations;
  case schedule::ActionKind::RecvGradients: return plan::TraceKind::RecvGradients;
  case schedule::ActionKind::Backward: return plan::TraceKind::Backward;
  case schedule::ActionKind::BackwardWeight: return plan::TraceKind::BackwardWeight;
  case schedule::ActionKind::SendGradients:
  case schedule::ActionKind::AwaitGradients: return plan::TraceKind::SendGradients; // its wait is the send's
  case schedule::ActionKind::AllReduce: return plan::TraceKind::AllReduce;
  case schedule::ActionKind::OptimizerStep: return plan::TraceKind::Optimizer;
  }
  return plan::TraceKind::Idle; // not reached: every kind is listed
}

TimelineRecorder::TimelineRecorder(std::string path, comm::Communicator &comm, int stage, int gpu)
    : path_(std::move(path)), comm_(comm), stage_(stage), gpu_(gpu) {
  if (!on()) return;
  comm_.barrier(); // Note [measured timeline]: the ranks' common origin
  origin_ = Clock::now();
  records_.reserve(1024);
}

void TimelineRecorder::beginStep(int64_t step, Clock::time_point start) {
  if (!on()) return;
  steps_.push_back({step, since(start), since(start), 0, records_.size(), records_.size()});
  if (gpu_ < 0) cpu_mark_s_ = runtime::threadCpuSeconds();
}

void TimelineRecorder::action(const schedule::Action &a, Clock::time_point start) {
  if (!on()) return;
  double cpu_s = 0;
  if (gpu_ < 0) { // a GPU's work is not the host thread's
    const double now = runtime::threadCpuSeconds();
    cpu_s = now - cpu_mark_s_;
    cpu_mark_s_ = now;
  }
  // An interleaved rank's action names its chunk's stage (Note [interleaved 1F1B]).
  records_.push_back({traceKindOf(a.kind), a.stage >= 0 ? a.stage : stage_, a.microbatch, since(start),
                      since(Clock::now()), cpu_s});
}

void TimelineRecorder::endStep() {
  if (!on() || steps_.empty()) return;
  StepSpan &s = steps_.back();
  s.end_s = since(Clock::now());
  s.last = records_.size();
  s.peak_bytes = gpu_ >= 0 ? runtime::gpuPeakAllocatedBytes(gpu_) : runtime::peakTensorBytes();
}

std::vector<plan::TraceEvent> TimelineRecorder::events() const {
  // Gaps shorter than this are the loop's own bookkeeping: drawing them
  // would double the events and show nothing.
  constexpr double kMinIdle_s = 10e-6;
  const int rank = comm_.rank();
  std::vector<plan::TraceEvent> out;
  auto add = [&](plan::TraceEvent e, int64_t step) {
    e.numbers["step"] = step;
    out.push_back(std::move(e));
  };
  auto idle = [&](double from, double to, int64_t step) {
    if (to - from >= kMinIdle_s) add(plan::traceEvent(plan::TraceKind::Idle, rank, stage_, -1, from, to - from), step);
  };
  for (const StepSpan &s : steps_) {
    double at = s.start_s;
    for (size_t i = s.first; i < s.last; ++i) {
      const Record &r = records_[i];
      idle(at, r.start_s, s.step);
      plan::TraceEvent e = plan::traceEvent(r.kind, rank, r.stage, r.microbatch, r.start_s, r.end_s - r.start_s);
      if (gpu_ < 0) e.numbers["cpu_us"] = int64_t(r.cpu_s * 1e6 + 0.5);
      add(std::move(e), s.step);
      at = r.end_s;
    }
    idle(at, s.end_s, s.step);
    add(plan::memoryCounter(rank, stage_, s.end_s, s.peak_bytes), s.step);
  }
  return out;
}

Status TimelineRecorder::write(std::ostream &log) {
  if (!on()) return Status::success();
  std::ostringstream mine;
  plan::writeChromeTrace(events(), {{comm_.rank(), plan::traceProcessName(comm_.rank(), stage_)}}, mine);
  // Every rank's trace to rank 0 by broadcasts: the end of the run, once,
  // and no message tag to keep apart from the schedule's.
  std::vector<plan::TraceEvent> all;
  std::map<int, std::string> names;
  for (int r = 0; r < comm_.size(); ++r) {
    std::string text = r == comm_.rank() ? mine.str() : std::string();
    uint64_t size = text.size();
    comm_.broadcast(&size, sizeof size, r);
    text.resize(size);
    comm_.broadcast(text.data(), size, r);
    if (comm_.rank() != 0) continue;
    auto trace = plan::readChromeTrace(text, "rank " + std::to_string(r) + "'s trace");
    if (!trace) return trace.error();
    all.insert(all.end(), trace->events.begin(), trace->events.end());
    names.insert(trace->process_names.begin(), trace->process_names.end());
  }
  if (comm_.rank() != 0) return Status::success();
  std::ostringstream text;
  plan::writeChromeTrace(all, names, text);
  if (Status st = writeFileAtomic(path_, text.str()); !st) return st;
  log << "rannc-exec: wrote " << path_ << " (" << all.size() << " events of " << comm_.size()
      << " rank(s); open it in ui.perfetto.dev, or compare it with the plan: rannc-plan compare PLAN " << path_
      << ")\n";
  return Status::success();
}

} // namespace rannc::train
