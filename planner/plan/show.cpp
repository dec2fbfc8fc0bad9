#include "planner/plan/show.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <iomanip>
#include <sstream>
#include <vector>

#include "planner/plan/plan.h"
#include "planner/support/format.h"

namespace rannc::plan {
std::string formatFixed(double v, int decimals) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(decimals) << v;
  return os.str();
}

namespace {


/// "8.18 GFLOP": three significant digits and an SI prefix.
std::string flopText(double flops) {
  static const char *prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int p = 0;
  while (flops >= 1000 && p < 6) {
    flops /= 1000;
    ++p;
  }
  return formatFixed(flops, flops < 10 ? 2 : flops < 100 ? 1 : 0) + " " + prefixes[p] + "FLOP";
}

std::string percent(double fraction) { return formatFixed(fraction * 100, 1) + "%"; }

/// "0-3,6": consecutive ranks as ranges.
std::string rankList(const proto::Stage &s) {
  std::string r;
  const auto &ranks = s.ranks();
  for (int i = 0; i < ranks.size();) {
    int j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    r += (r.empty() ? "" : ",") + std::to_string(ranks[i]);
    if (j > i) r += (j == i + 1 ? "," : "-") + std::to_string(ranks[j]);
    i = j + 1;
  }
  return r;
}

std::string opName(const proto::Plan &plan, int i, size_t width) {
  if (i < 0 || i >= plan.graph().ops_size()) return "?";
  std::string n = plan.graph().ops(i).name();
  if (n.size() <= width) return n;
  const size_t keep = (width - 2) / 2;
  return n.substr(0, keep) + ".." + n.substr(n.size() - (width - 2 - keep));
}

double samplesPerSecond(const proto::Plan &plan) {
  const double t = plan.estimates().step_time_s();
  return t > 0 ? double(plan.global_batch_size()) / t : 0.0;
}

int64_t microbatchSize(const proto::Plan &plan) {
  return plan.microbatches() > 0 ? plan.global_batch_size() / plan.microbatches() : 0;
}

} // namespace

std::string bytesText(double bytes) { return formatBytes(bytes, ByteStyle::Short); }

std::string timeText(double seconds) {
  const double a = seconds < 0 ? -seconds : seconds;
  if (a == 0) return "0 s";
  if (a >= 1) return formatFixed(seconds, 3) + " s";
  if (a >= 1e-3) return formatFixed(seconds * 1e3, 3) + " ms";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3g us", seconds * 1e6);
  return buf;
}

TimeUnit timeUnitFor(double step_seconds) {
  return step_seconds > 0 && step_seconds < 1e-3 ? TimeUnit{1e6, "us"} : TimeUnit{1e3, "ms"};
}

std::string timeIn(double seconds, TimeUnit unit) { return formatFixed(seconds * unit.per_second, 3); }

const char *scheduleName(proto::Schedule s) {
  auto schedule = scheduleFromProto(s);
  return schedule ? pipeline::scheduleName(*schedule) : "unspecified";
}

double stageBusyTime(const proto::Plan &plan, int s) {
  const auto &e = plan.stages(s).estimates();
  return plan.microbatches() * (e.fwd_time_s() + e.bwd_time_s()) + e.allreduce_time_s();
}

// Note [pipeline bubble]
// The pipeline phase of a step (before the all-reduce and optimizer) lasts, in
// the partitioner's closed form (pipeline::pipelineTime, docs/partitioner.md)
// with forward slots F_s, backward slots G_s and M micro-batches,
//   GPipe: ΣF + (M-1)·max F + ΣG + (M-1)·max G,   1F1B: Σ(F+G) + (M-1)·max(F+G),
//   ZB-H1 (W_s of G_s its weight gradients, M >= S): 1F1B's less 2·Σ_{s<S-1} W_s,
//   interleaved 1F1B (v chunks on p ranks, T_r = the slots of rank r's chunks):
//   M·max T_r + (Σ(F+G) - max T_r)/v (Note [interleaved 1F1B]).
// Stage s computes for M·(F_s+G_s) of it; the rest is bubble. The fraction
// shown is the idle share averaged over the pipeline ranks, which for S
// equal stages is the textbook (S-1)/(M+S-1), and for p ranks of v equal
// chunks (p-1)/(vM+p-1) (Megatron's (p-1)/(vM) of the ideal time). A plan
// whose schedule field names none (which `check` reports) is costed as 1F1B.
double pipelineBubbleFraction(const proto::Plan &plan) {
  const int S = plan.stages_size();
  const int M = std::max(1, plan.microbatches());
  if (S == 0) return 0;
  std::vector<pipeline::StageSlots> slots;
  double busy = 0;
  for (const auto &st : plan.stages()) {
    const double f = st.estimates().fwd_time_s(), g = st.estimates().bwd_time_s();
    slots.push_back({f, g, st.estimates().weight_time_s()});
    busy += double(M) * (f + g);
  }
  auto schedule = scheduleFromProto(plan.schedule());
  const double pipe =
      pipeline::pipelineTime(schedule ? *schedule : pipeline::Schedule::OneFOneB, slots, M, virtualStages(plan)).total();
  if (pipe <= 0) return 0;
  return std::clamp(1 - busy / (pipelineRanks(plan) * pipe), 0.0, 1.0);
}

void printPlanTable(const proto::Plan &plan, std::ostream &os) {
  const auto &c = plan.cluster();
  const double step = plan.estimates().step_time_s();
  const auto &m = plan.model();
  os << "model        " << m.path() << " (" << (m.format().empty() ? "onnx" : m.format()) << ", sha256 "
     << m.sha256().substr(0, 12) << (m.external_data_size() ? ", with external data" : "") << ")\n";
  if (m.inputs_size()) {
    os << "inputs       ";
    for (int i = 0; i < m.inputs_size(); ++i)
      os << (i ? ", " : "") << m.inputs(i).name() << ": " << m.inputs(i).dtype() << m.inputs(i).shape();
    os << " (from " << m.inputs_from() << ")\n";
  }
  os << "cluster      " << c.num_nodes() << (c.num_nodes() == 1 ? " node" : " nodes") << " x " << c.devices_per_node()
     << " " << c.device().name() << " (" << bytesText(double(c.device().memory_bytes())) << " each)\n";
  os << "planner      " << plan.planner() << "; memory for " << plan.estimates().optimizer() << "\n";
  os << "world size   " << worldSize(plan) << (worldSize(plan) == 1 ? " rank" : " ranks") << " in "
     << plan.stages_size() << (plan.stages_size() == 1 ? " stage" : " stages")
     << (virtualStages(plan) > 1 ? ", " + std::to_string(virtualStages(plan)) + " on each of " +
                                       std::to_string(pipelineRanks(plan)) + " pipeline ranks"
                                 : std::string())
     << "\n";
  os << "batch        " << plan.global_batch_size() << " samples per step in " << plan.microbatches()
     << (plan.microbatches() == 1 ? " micro-batch" : " micro-batches") << " of " << microbatchSize(plan)
     << ", schedule " << scheduleName(plan.schedule()) << "\n";
  // Mixed precision (fp32 plans say nothing, as before it existed).
  const bool lowp = !plan.precision().empty() && plan.precision() != "fp32";
  if (lowp)
    os << "precision    " << plan.precision() << " compute under autocast; fp32 weights, gradients and optimizer state\n";
  // Note [automatic schedule] in planner/partition/dp.cpp (only plans it chose other than 1F1B carry them).
  for (int i = 0; i < plan.schedules_considered_size(); ++i) {
    const proto::ScheduleConsidered &sc = plan.schedules_considered(i);
    os << (i ? "             " : "schedules    ") << scheduleName(sc.schedule())
       << (sc.virtual_stages() > 1 ? " v=" + std::to_string(sc.virtual_stages()) : std::string()) << ": "
       << sc.outcome();
    if (sc.outcome() == "chosen") os << ", step " << formatFixed(sc.step_time_s(), 6) << " s";
    if (!sc.why().empty()) os << " (" << sc.why() << ")";
    os << "\n";
  }
  os << "\n";

  const TimeUnit unit = timeUnitFor(step);
  const std::string u = std::string(" ") + unit.name;
  // A "tp" column only where a stage is tensor-parallel: other plans print as before.
  bool any_tp = false;
  for (const auto &s : plan.stages()) any_tp |= tensorParallel(s) > 1;
  os << std::left << std::setw(6) << "stage" << std::setw(8) << "ranks";
  if (any_tp) os << std::setw(4) << "tp";
  os << std::setw(6) << "ops" << std::setw(13)
     << "range" << std::setw(32) << "first op" << std::setw(32) << "last op" << std::right << std::setw(10) << "params"
     << std::setw(10) << "fwd" + u << std::setw(10) << "bwd" + u << std::setw(10) << "ar" + u << std::setw(10)
     << "busy" + u << std::setw(7) << "util"
     << "\n";
  for (int i = 0; i < plan.stages_size(); ++i) {
    const auto &s = plan.stages(i);
    const auto &e = s.estimates();
    const double busy = stageBusyTime(plan, i);
    os << std::left << std::setw(6) << s.id() << std::setw(8) << rankList(s);
    if (any_tp) os << std::setw(4) << tensorParallel(s);
    os << std::setw(6) << (s.op_end() - s.op_begin()) << std::setw(13)
       << ("[" + std::to_string(s.op_begin()) + ", " + std::to_string(s.op_end()) + ")") << std::setw(32)
       << opName(plan, s.op_begin(), 30) << std::setw(32) << opName(plan, s.op_end() - 1, 30) << std::right
       << std::setw(10) << e.num_params() << std::setw(10) << timeIn(e.fwd_time_s(), unit) << std::setw(10)
       << timeIn(e.bwd_time_s(), unit) << std::setw(10) << timeIn(e.allreduce_time_s(), unit) << std::setw(10)
       << timeIn(busy, unit) << std::setw(7) << (step > 0 ? percent(busy / step) : "-") << "\n";
  }

  os << "\nmemory per device\n";
  os << std::left << std::setw(6) << "stage" << std::right;
  bool stash = false;
  for (const auto &s : plan.stages()) stash |= s.estimates().recompute_stash_bytes() > 0;
  for (const char *h : {"params", "grads", "optimizer", "activations"}) os << std::setw(12) << h;
  if (stash) os << std::setw(12) << "stash";
  for (const char *h : {"working", "buffers"}) os << std::setw(12) << h;
  if (lowp) os << std::setw(12) << plan.precision() + " wts";
  for (const char *h : {"peak", "capacity"}) os << std::setw(12) << h;
  os << std::setw(7) << "use"
     << "\n";
  for (const auto &s : plan.stages()) {
    const auto &e = s.estimates();
    os << std::left << std::setw(6) << s.id() << std::right;
    for (int64_t b : {e.param_bytes(), e.grad_bytes(), e.optimizer_bytes(), e.activation_bytes()})
      os << std::setw(12) << bytesText(double(b));
    if (stash) os << std::setw(12) << bytesText(double(e.recompute_stash_bytes()));
    for (int64_t b : {e.working_bytes(), e.buffer_bytes()}) os << std::setw(12) << bytesText(double(b));
    if (lowp) os << std::setw(12) << bytesText(double(e.lowp_weight_bytes()));
    for (int64_t b : {e.peak_memory_bytes(), e.memory_capacity_bytes()}) os << std::setw(12) << bytesText(double(b));
    os << std::setw(7)
       << (e.memory_capacity_bytes() > 0 ? percent(double(e.peak_memory_bytes()) / e.memory_capacity_bytes()) : "-");
    if (e.peak_memory_bytes() > e.memory_capacity_bytes()) os << "  OVER CAPACITY";
    os << "\n";
  }

  // GPU plans: what the capacity column already leaves out (cpu reserves nothing).
  if (const int64_t reserve = c.device().runtime_reserve_bytes(); reserve > 0)
    os << "runtime reserve: " << bytesText(double(reserve)) << " of each " << bytesText(double(c.device().memory_bytes()))
       << " device is held outside tensors (CUDA context, cuBLAS workspaces, allocator segments) and is not in "
          "the capacity\n";
  for (const auto &s : plan.stages())
    if (s.recompute())
      os << "recompute: stage " << s.id() << " keeps only its inputs per micro-batch (the stash) and re-runs "
         << "forward before backward, saving " << bytesText(double(s.estimates().recompute_saved_bytes()))
         << " of activations\n";
  for (const auto &s : plan.stages())
    if (const int t = tensorParallel(s); t > 1) {
      os << "tensor-parallel: stage " << s.id() << " splits its layers over " << stageReplicas(s)
         << (stageReplicas(s) == 1 ? " group" : " groups") << " of " << t << " ranks (";
      for (int g = 0; g < stageReplicas(s); ++g)
        os << (g ? ", " : "") << s.ranks(g * t) << "-" << s.ranks(g * t + t - 1);
      os << ")";
      if (plan.graph().has_sharding()) {
        const auto &sh = plan.graph().sharding();
        int split = 0, collectives = 0;
        for (int n : sh.split_ops()) split += n >= s.op_begin() && n < s.op_end();
        for (const auto &c : sh.collectives())
          collectives += !c.readers().empty() && c.readers(0) >= s.op_begin() && c.readers(0) < s.op_end();
        os << ": " << split << " of its " << (s.op_end() - s.op_begin()) << " ops run on slices, " << collectives
           << (collectives == 1 ? " collective" : " collectives");
      }
      os << "\n";
    }
  for (const auto &s : plan.stages())
    if (s.zero() > 0)
      os << "zero: stage " << s.id() << " shards its optimizer state over its " << stageReplicas(s)
         << " replicas (each updates its share, then they all-gather the parameters), saving "
         << bytesText(double(s.estimates().zero_saved_bytes())) << " per device\n";

  if (plan.batchnorm() == "exact") // Note [batch statistics]
    os << "batchnorm: exact: one micro-batch, each BatchNorm's statistics summed over its stage's replicas, as on "
          "one device\n";
  for (const std::string &note : batchStatisticsNotes(plan)) os << "warning: batchnorm: " << note << "\n";

  os << "\npredicted step time  " << timeText(step);
  if (step > 0) os << " (" << formatFixed(samplesPerSecond(plan), 1) << " samples/s)";
  if (const auto &e = plan.estimates(); e.training_flops_per_sample() > 0) {
    os << "\nmodel arithmetic     " << flopText(e.forward_flops_per_sample()) << " forward, "
       << flopText(e.training_flops_per_sample()) << " forward+backward per sample";
    if (step > 0)
      os << "; " << flopText(e.training_flops_per_sample() * double(plan.global_batch_size()) / step)
         << "/s at the predicted step";
  }
  os << "\npipeline bubble      " << percent(pipelineBubbleFraction(plan)) << " of the pipeline phase idle ("
     << scheduleName(plan.schedule()) << ", " << plan.stages_size()
     << (plan.stages_size() == 1 ? " stage, " : " stages, ") << plan.microbatches()
     << (plan.microbatches() == 1 ? " micro-batch)" : " micro-batches)") << "\n";
}

void printPlanJson(const proto::Plan &plan, std::ostream &os) {
  const double step = plan.estimates().step_time_s();
  nlohmann::ordered_json j;
  j["world_size"] = worldSize(plan);
  j["num_stages"] = plan.stages_size();
  j["global_batch_size"] = plan.global_batch_size();
  j["microbatches"] = plan.microbatches();
  j["schedule"] = scheduleName(plan.schedule());
  j["virtual_stages"] = virtualStages(plan); // Note [interleaved 1F1B]
  j["pipeline_ranks"] = pipelineRanks(plan);
  j["predicted_step_time_s"] = step;
  j["forward_flops_per_sample"] = plan.estimates().forward_flops_per_sample();
  j["training_flops_per_sample"] = plan.estimates().training_flops_per_sample();
  j["samples_per_s"] = samplesPerSecond(plan);
  j["microbatch_size"] = microbatchSize(plan);
  j["bubble_fraction"] = pipelineBubbleFraction(plan);
  j["predicted_bubble_fraction"] = pipelineBubbleFraction(plan); // issue 28's name for it, every schedule
  if (plan.schedules_considered_size() > 0) { // Note [automatic schedule] in planner/partition/dp.cpp
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const proto::ScheduleConsidered &sc : plan.schedules_considered()) {
      nlohmann::ordered_json one;
      one["schedule"] = scheduleName(sc.schedule());
      one["virtual_stages"] = std::max(1, sc.virtual_stages());
      one["outcome"] = sc.outcome();
      one["step_time_s"] = sc.step_time_s();
      one["why"] = sc.why();
      list.push_back(std::move(one));
    }
    j["schedules_considered"] = std::move(list);
  }
  j["format_version"] = plan.format_version();
  j["model"] = plan.model().path();
  j["model_sha256"] = plan.model().sha256();
  j["model_format"] = plan.model().format().empty() ? "onnx" : plan.model().format();
  j["device"] = plan.cluster().device().name();
  j["device_memory_bytes"] = plan.cluster().device().memory_bytes();
  j["device_runtime_reserve_bytes"] = plan.cluster().device().runtime_reserve_bytes();
  j["num_nodes"] = plan.cluster().num_nodes();
  j["devices_per_node"] = plan.cluster().devices_per_node();
  j["planner"] = plan.planner();
  j["precision"] = plan.precision().empty() ? "fp32" : plan.precision();
  j["optimizer"] = plan.estimates().optimizer();
  j["num_ops"] = plan.graph().ops_size();
  j["stages"] = nlohmann::ordered_json::array();
  for (int i = 0; i < plan.stages_size(); ++i) {
    const auto &s = plan.stages(i);
    const auto &e = s.estimates();
    nlohmann::ordered_json st;
    st["id"] = s.id();
    st["ranks"] = std::vector<int>(s.ranks().begin(), s.ranks().end());
    st["tensor_parallel"] = tensorParallel(s);
    st["replicas"] = stageReplicas(s);
    st["num_ops"] = s.op_end() - s.op_begin();
    st["op_begin"] = s.op_begin();
    st["op_end"] = s.op_end();
    st["first_op"] =
        s.op_begin() >= 0 && s.op_begin() < plan.graph().ops_size() ? plan.graph().ops(s.op_begin()).name() : "";
    st["last_op"] =
        s.op_end() >= 1 && s.op_end() <= plan.graph().ops_size() ? plan.graph().ops(s.op_end() - 1).name() : "";
    st["num_params"] = e.num_params();
    st["param_bytes"] = e.param_bytes();
    st["grad_bytes"] = e.grad_bytes();
    st["optimizer_bytes"] = e.optimizer_bytes();
    st["activation_bytes"] = e.activation_bytes();
    st["working_bytes"] = e.working_bytes();
    st["buffer_bytes"] = e.buffer_bytes();
    st["recompute_stash_bytes"] = e.recompute_stash_bytes();
    st["weight_queue_bytes"] = e.weight_queue_bytes(); // Note [zero bubble H1]
    st["peak_memory_bytes"] = e.peak_memory_bytes();
    if (e.rank_peak_memory_bytes() > 0) st["rank_peak_memory_bytes"] = e.rank_peak_memory_bytes(); // interleaved
    st["memory_capacity_bytes"] = e.memory_capacity_bytes();
    st["fwd_time_s"] = e.fwd_time_s();
    st["bwd_time_s"] = e.bwd_time_s();
    st["allreduce_time_s"] = e.allreduce_time_s();
    st["recompute"] = s.recompute();
    st["recompute_saved_bytes"] = e.recompute_saved_bytes();
    st["zero"] = s.zero();
    st["zero_saved_bytes"] = e.zero_saved_bytes();
    st["lowp_weight_bytes"] = e.lowp_weight_bytes();
    st["busy_time_s"] = stageBusyTime(plan, i);
    st["utilisation"] = step > 0 ? stageBusyTime(plan, i) / step : 0.0;
    j["stages"].push_back(std::move(st));
  }
  j["batch_statistics_warnings"] = batchStatisticsNotes(plan); // Note [batch statistics]
  if (!plan.batchnorm().empty()) j["batchnorm"] = plan.batchnorm();
  os << j.dump(2) << "\n";
}

} // namespace rannc::plan
