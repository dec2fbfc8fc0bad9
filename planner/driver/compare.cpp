#include "planner/driver/compare.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

#include "planner/driver/tooling.h"
#include "planner/plan/plan.h"
#include "planner/plan/show.h"
#include "planner/support/files.h"

namespace rannc::planner {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

int64_t number(const plan::TraceEvent &e, const char *key, int64_t otherwise) {
  auto it = e.numbers.find(key);
  return it == e.numbers.end() ? otherwise : it->second;
}

} // namespace

Expected<MeasuredRun> measureTrace(const plan::Trace &trace, const std::string &what) {
  // rank -> the stages its actions name: one, or an interleaved rank's chunks (Note [interleaved 1F1B])
  std::map<int, std::set<int>> stages_of;
  std::set<int64_t> steps;
  for (const plan::TraceEvent &e : trace.events) {
    if (e.counter) continue;
    const int64_t stage = number(e, "stage", -1);
    if (stage < 0) return Error{what + ": event '" + e.name + "' of rank " + std::to_string(e.pid) + " has no stage"};
    stages_of[e.pid].insert(int(stage));
    steps.insert(number(e, "step", 0));
  }
  if (steps.empty()) return Error{what + ": no actions (a trace of rannc-exec --trace with at least one step)"};
  MeasuredRun run;
  run.ranks = int(stages_of.size());
  run.steps_in_trace = int64_t(steps.size());
  run.first_step = steps.size() > 1 ? *std::next(steps.begin()) : *steps.begin(); // Note [measured figures]
  run.last_step = *steps.rbegin();
  auto kept = [&](const plan::TraceEvent &e) { return number(e, "step", 0) >= run.first_step; };

  // Per step: its span over all ranks.
  std::map<int64_t, std::pair<double, double>> span;
  // Per (rank, step): seconds by category; per stage: each forward's and backward's duration.
  std::map<std::pair<int, int64_t>, std::map<std::string, double>> by_kind;
  std::map<int64_t, std::vector<double>> forwards, backwards;
  std::map<int, int64_t> peak;
  std::map<std::pair<int, int64_t>, double> compute_cpu; // (rank, step) -> CPU seconds of its compute
  double cpu_sum = 0, wall_sum = 0; // of the compute actions that carry their CPU time (Note [load-normalised step])
  for (const plan::TraceEvent &e : trace.events) {
    if (e.counter) {
      if (e.name == "memory") peak[e.pid] = std::max(peak[e.pid], number(e, "bytes", 0));
      continue;
    }
    if (!kept(e)) continue;
    const int64_t step = number(e, "step", 0);
    auto [it, fresh] = span.emplace(step, std::make_pair(e.start_s, e.start_s + e.duration_s));
    if (!fresh) {
      it->second.first = std::min(it->second.first, e.start_s);
      it->second.second = std::max(it->second.second, e.start_s + e.duration_s);
    }
    by_kind[{e.pid, step}][e.category] += e.duration_s;
    const bool compute = e.category == "forward" || e.category == "backward" || e.category == "recompute";
    if (const int64_t cpu_us = number(e, "cpu_us", -1); cpu_us >= 0) {
      if (compute || e.category == "all-reduce") compute_cpu[{e.pid, step}] += double(cpu_us) * 1e-6;
      if (compute || e.category == "optimizer") {
        cpu_sum += double(cpu_us) * 1e-6;
        wall_sum += e.duration_s;
      }
    }
    if (e.category == "forward") forwards[number(e, "stage", -1)].push_back(e.duration_s);
    if (e.category == "backward") backwards[number(e, "stage", -1)].push_back(e.duration_s);
  }
  std::vector<double> spans;
  for (const auto &[step, s] : span) spans.push_back(s.second - s.first);
  run.step_s = median(spans);
  run.cpu_share = wall_sum > 0 ? cpu_sum / wall_sum : 0;

  std::map<int, MeasuredStage> stages;
  for (const auto &[rank, ran] : stages_of)
    for (int stage : ran) {
      MeasuredStage &m = stages[stage];
      m.stage = stage;
      m.ranks++;
      m.peak_bytes = std::max(m.peak_bytes, peak.count(rank) ? peak.at(rank) : 0);
    }
  // Forwards and backwards are the stage's own; the per-step figures are its
  // ranks', which an interleaved rank's chunks share.
  for (auto &[stage, m] : stages) {
    std::map<std::string, std::vector<double>> per_step;
    for (const auto &[rank, ran] : stages_of) {
      if (!ran.count(stage)) continue;
      for (int64_t step = run.first_step; step <= run.last_step; ++step) {
        auto it = by_kind.find({rank, step});
        if (it == by_kind.end()) continue;
        auto of = [&](const char *k) { return it->second.count(k) ? it->second.at(k) : 0.0; };
        for (const char *k : {"all-reduce", "optimizer", "recv", "send", "idle"}) per_step[k].push_back(of(k));
        per_step["compute"].push_back(of("forward") + of("backward") + of("recompute") + of("all-reduce"));
        if (auto c = compute_cpu.find({rank, step}); c != compute_cpu.end()) per_step["compute cpu"].push_back(c->second);
      }
    }
    m.forward_s = median(forwards[stage]);
    m.backward_s = median(backwards[stage]);
    m.allreduce_s = median(per_step["all-reduce"]);
    m.optimizer_s = median(per_step["optimizer"]);
    m.recv_s = median(per_step["recv"]);
    m.send_s = median(per_step["send"]);
    m.idle_s = median(per_step["idle"]);
    m.compute_s = median(per_step["compute"]);
    m.compute_cpu_s = median(per_step["compute cpu"]);
  }
  for (auto &[stage, m] : stages) run.stages.push_back(m);
  return run;
}

namespace {

std::string cell(double v, bool bytes, bool known) {
  if (!known) return "-";
  return bytes ? plan::bytesText(v) : plan::timeText(v);
}

} // namespace

Expected<MeasuredRun> measurePlanRun(const proto::Plan &plan, const std::string &plan_path,
                                     const std::string &trace_path) {
  auto text = readFile(trace_path);
  if (!text) return text.error();
  auto trace = plan::readChromeTrace(*text, trace_path);
  if (!trace) return trace.error();
  auto run = measureTrace(*trace, trace_path);
  if (!run) return run.error();
  // The trace must be of this plan's layout: its ranks, each in its stage.
  const int world = plan::worldSize(plan);
  if (run->ranks != world || int(run->stages.size()) != plan.stages_size())
    return Error{trace_path + ": a run of " + std::to_string(run->ranks) + " rank(s) in " +
                 std::to_string(run->stages.size()) + " stage(s), but " + plan_path + " has " + std::to_string(world) +
                 " rank(s) in " + std::to_string(plan.stages_size()) + ": not a run of this plan"};
  for (const MeasuredStage &m : run->stages)
    if (m.stage >= plan.stages_size() || m.ranks != plan.stages(m.stage).ranks_size())
      return Error{trace_path + ": stage " + std::to_string(m.stage) + " ran on " + std::to_string(m.ranks) +
                   " rank(s), not as " + plan_path + " says: not a run of this plan"};
  return run;
}

// Note [comparing an interleaved run]
// An interleaved rank runs v stages, its chunks (Note [interleaved 1F1B]):
// each chunk's forwards and backwards are its own, and the trace names each
// action's chunk, but the rank's all-reduce time, busy time and peak memory
// are one figure for all of them. So compare gives a forward and a backward
// row per stage and the rest per rank group, labelled by its stages ("0+2"),
// against the sums of the chunks' estimates and the plan's per-rank peak
// (Estimates::rank_peak_memory_bytes, Note [a rank's chunks' memory] in
// planner/partition/evaluate.cpp). With one stage a rank both are the stage's.
std::vector<CompareRow> compareRows(const proto::Plan &plan, const MeasuredRun &run) {
  std::vector<CompareRow> rows;
  const int v = plan::virtualStages(plan), p = plan.stages_size() / std::max(1, v);
  // The rows of a rank group: `first`'s measured figures, the stages' summed estimates.
  auto rankRows = [&](const MeasuredStage &first, const std::string &label) {
    double allreduce = 0, busy = 0;
    bool replicated = false;
    for (int s = first.stage; s < plan.stages_size(); s += v > 1 ? p : plan.stages_size()) {
      allreduce += plan.stages(s).estimates().allreduce_time_s();
      busy += plan::stageBusyTime(plan, s);
      replicated |= plan::stageReplicas(plan.stages(s)) > 1;
    }
    // Without replicas the all-reduce is a no-op (the shared-parameter sum aside).
    if (allreduce > 0 || replicated) rows.push_back({label, "all-reduce", allreduce, first.allreduce_s, false});
    // show's busy (M x (forward + backward) + all-reduce) against the measured
    // compute: not the receives, which include waiting for the peer.
    rows.push_back({label, "busy per step", busy, first.compute_s, false});
    if (run.cpu_share > 0) rows.push_back({label, "busy per step, CPU time", busy, first.compute_cpu_s, false});
    const auto &est = plan.stages(first.stage).estimates();
    const int64_t peak = est.rank_peak_memory_bytes() > 0 ? est.rank_peak_memory_bytes() : est.peak_memory_bytes();
    rows.push_back({label, "peak memory", double(peak), double(first.peak_bytes), true});
  };
  for (const MeasuredStage &m : run.stages) {
    const auto &est = plan.stages(m.stage).estimates();
    const std::string s = std::to_string(m.stage);
    rows.push_back({s, "forward per micro-batch", est.fwd_time_s(), m.forward_s, false});
    rows.push_back({s, "backward per micro-batch", est.bwd_time_s(), m.backward_s, false});
    if (v == 1) rankRows(m, s);
  }
  if (v > 1) // Note [comparing an interleaved run]
    for (const MeasuredStage &m : run.stages) {
      if (m.stage >= p) continue;
      std::string label = std::to_string(m.stage);
      for (int s = m.stage + p; s < plan.stages_size(); s += p) label += "+" + std::to_string(s);
      rankRows(m, label);
    }
  rows.push_back({"all", "step time", plan.estimates().step_time_s(), run.step_s, false});
  if (run.cpu_share > 0) // Note [load-normalised step]
    rows.push_back({"all", "step time on own cores", plan.estimates().step_time_s(), run.step_s * run.cpu_share, false});
  return rows;
}

Status runCompare(const CompareOptions &opts, std::ostream &out, std::ostream &log) {
  (void)log;
  auto plan = readSoundPlan(opts.plan);
  if (!plan) return plan.error();
  auto run = measurePlanRun(*plan, opts.plan, opts.trace);
  if (!run) return run.error();
  const int world = plan::worldSize(*plan);
  const std::vector<CompareRow> rows = compareRows(*plan, *run);

  if (opts.json) {
    nlohmann::ordered_json j;
    j["plan"] = opts.plan;
    j["trace"] = opts.trace;
    j["steps_measured"] = {run->first_step, run->last_step};
    j["rows"] = nlohmann::ordered_json::array();
    for (const CompareRow &r : rows)
      j["rows"].push_back({{"stage", r.stage},
                           {"what", r.what},
                           {"unit", r.bytes ? "bytes" : "s"},
                           {"predicted", r.predicted},
                           {"measured", r.measured},
                           {"ratio", r.ratio()}});
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (const MeasuredStage &m : run->stages)
      stages.push_back({{"id", m.stage},
                        {"ranks", m.ranks},
                        {"forward_s", m.forward_s},
                        {"backward_s", m.backward_s},
                        {"allreduce_s", m.allreduce_s},
                        {"optimizer_s", m.optimizer_s},
                        {"recv_s", m.recv_s},
                        {"send_s", m.send_s},
                        {"idle_s", m.idle_s},
                        {"compute_s", m.compute_s},
                        {"compute_cpu_s", m.compute_cpu_s},
                        {"peak_memory_bytes", m.peak_bytes}});
    j["measured_stages"] = std::move(stages);
    j["measured_step_time_s"] = run->step_s;
    j["predicted_step_time_s"] = plan->estimates().step_time_s();
    j["cpu_share"] = run->cpu_share;
    out << j.dump(2) << "\n";
    return Status::success();
  }
  out << opts.plan << " against " << opts.trace << ": " << plan->stages_size() << " stage(s) on " << world
      << " rank(s), " << plan::scheduleName(plan->schedule()) << ", " << plan->microbatches()
      << " micro-batch(es); measured steps " << run->first_step << ".." << run->last_step;
  if (run->steps_in_trace > 1) out << " (the first left out as warm-up)";
  out << "\n\n";
  size_t width = 7; // "stage", or a rank group's label ("0+4+8+12")
  for (const CompareRow &r : rows) width = std::max(width, r.stage.size() + 2);
  const int w = static_cast<int>(width);
  out << std::left << std::setw(w) << "stage" << std::setw(26) << "" << std::right << std::setw(12) << "predicted"
      << std::setw(12) << "measured" << std::setw(8) << "ratio"
      << "\n";
  for (const CompareRow &r : rows) {
    const double q = r.ratio();
    out << std::left << std::setw(w) << r.stage << std::setw(26) << r.what << std::right << std::setw(12)
        << cell(r.predicted, r.bytes, r.predicted > 0) << std::setw(12) << cell(r.measured, r.bytes, true)
        << std::setw(8) << (q > 0 ? plan::formatFixed(q, 2) : "-") << "\n";
  }
  out << "(ratio: predicted / measured; times are medians over the stage's ranks and the measured steps; "
         "a receive includes waiting for its peer)\n";
  if (plan::virtualStages(*plan) > 1)
    out << "(a row of several stages is their ranks': an interleaved rank runs them all, and shares its all-reduce, "
           "busy time and peak memory between them)\n";
  if (run->cpu_share > 0)
    out << "(the ranks computed " << plan::formatFixed(run->cpu_share * 100, 0)
        << "% of their wall time: the rest, other processes held their cores; \"on own cores\" is the step "
           "times that share)\n";
  return Status::success();
}

} // namespace rannc::planner
