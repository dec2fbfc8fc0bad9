#include "planner/driver/options.h"

#include <algorithm>

#include "planner/cluster/cluster.h"
#include "planner/cost/precision.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"
#include "planner/pipeline/schedule.h"
#include "planner/support/words.h"

namespace rannc::planner {
namespace {

const char *const kRecompute[] = {"auto", "on", "off"}; // in Recompute's order
const char *const kZero[] = {"auto", "0", "1"};         // in Zero's order
const char *const kBatchNorm[] = {"local", "exact"};   // PlanOptions::exact_batchnorm false, true

/// Sets `out` from a --device-memory text; empty leaves it unset.
Status parseDeviceMemory(std::string_view text, std::optional<int64_t> &out) {
  if (text.empty()) return {};
  auto bytes = cluster::parseByteSize(std::string(text));
  if (!bytes) return Error{"--device-memory: " + bytes.error().message};
  out = *bytes;
  return {};
}

} // namespace

Expected<Recompute> parseRecompute(std::string_view text) {
  if (auto r = enumFromWord<Recompute>(text, kRecompute)) return *r;
  return Error{"--recompute must be auto, on or off (got '" + std::string(text) + "')"};
}

Expected<Zero> parseZero(std::string_view text) {
  if (auto z = enumFromWord<Zero>(text, kZero)) return *z;
  return Error{"--zero must be auto, 0 or 1 (got '" + std::string(text) + "')"};
}

Expected<std::vector<int>> parseTensorParallel(std::string_view text) {
  auto bad = [&] {
    return Error{"--tensor-parallel must be auto, a degree N or one degree per stage N1,N2,... (got '" +
                 std::string(text) + "')"};
  };
  if (text == "auto") return std::vector<int>{};
  std::vector<int> out;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t end = std::min(text.find(',', start), text.size());
    const std::string_view item = text.substr(start, end - start);
    if (item.empty() || item.size() > 6 || item.find_first_not_of("0123456789") != std::string_view::npos) return bad();
    const int t = std::stoi(std::string(item));
    if (t < 1) return bad();
    out.push_back(t);
    start = end + 1;
  }
  return out;
}

std::vector<std::string> recomputeNames() { return wordList(kRecompute); }
std::vector<std::string> zeroNames() { return wordList(kZero); }
std::vector<std::string> batchNormNames() { return wordList(kBatchNorm); }

std::vector<std::string> scheduleNames() {
  std::vector<std::string> out{"auto"};
  for (pipeline::Schedule s : pipeline::kSchedules) out.push_back(pipeline::scheduleName(s));
  return out;
}

Status finishPlanOptions(const PlanFlags &flags, PlanOptions &opts) {
  if (!opts.cluster_file.empty() && flags.devices_given)
    return Error{"--cluster describes the devices; do not combine it with --gpus or --device-type"};
  if (Status st = parseDeviceMemory(flags.device_memory, opts.device_memory); !st) return st;
  auto precision = cost::parsePrecision(flags.precision);
  if (!precision) return Error{"--precision: " + precision.error().message};
  opts.precision = *precision;
  auto recompute = parseRecompute(flags.recompute);
  if (!recompute) return recompute.error();
  opts.recompute = *recompute;
  auto zero = parseZero(flags.zero);
  if (!zero) return zero.error();
  opts.zero = *zero;
  auto tp = parseTensorParallel(flags.tensor_parallel);
  if (!tp) return tp.error();
  opts.tensor_parallel = *tp;
  if (opts.tensor_parallel.size() > 1 && opts.replicas.size() > 1 &&
      opts.tensor_parallel.size() != opts.replicas.size())
    return Error{"--tensor-parallel gives " + std::to_string(opts.tensor_parallel.size()) +
                 " per-stage degrees but --replicas " + std::to_string(opts.replicas.size()) + " per-stage counts"};
  auto optimizer = cost::parseOptimizer(flags.optimizer);
  if (!optimizer) return Error{"--optimizer " + optimizer.error().message};
  opts.optimizer = *optimizer;
  auto batchnorm = enumFromWord<bool>(flags.batchnorm, kBatchNorm);
  if (!batchnorm) return Error{"--batchnorm must be local or exact (got '" + flags.batchnorm + "')"};
  opts.exact_batchnorm = *batchnorm;
  opts.schedule.reset();
  opts.auto_schedule = flags.schedule.empty() || flags.schedule == "auto"; // Note [schedule default] in lower.cpp
  if (!flags.schedule.empty() && flags.schedule != "auto") { // auto: the partitioner chooses (Note [automatic schedule])
    auto schedule = pipeline::parseSchedule(flags.schedule);
    if (!schedule)
      return Error{"--schedule must be auto, " + pipeline::scheduleChoices() + " (got '" + flags.schedule + "')"};
    opts.schedule = *schedule;
  }
  // Note [interleaved 1F1B]: chunks need the schedule that runs them, and it needs chunks.
  const pipeline::Schedule pinned = opts.schedule.value_or(pipeline::Schedule::OneFOneB);
  if (std::string why = pipeline::interleavingProblem(pinned, 0, opts.virtual_stages, 0); !why.empty())
    return Error{"--virtual-stages: " + why};
  if (pipeline::interleaves(pinned)) {
    const char *name = pipeline::scheduleName(pinned);
    if (opts.virtual_stages < 2)
      return Error{"--schedule " + std::string(name) + " needs --virtual-stages 2 or more (with one chunk per rank "
                   "it is 1f1b)"};
    if (opts.stages < 1) return Error{"--schedule " + std::string(name) + " needs --stages N (the pipeline ranks)"};
    // A rank's chunks share its groups.
    if (opts.tensor_parallel.size() > 1 && int(opts.tensor_parallel.size()) != opts.stages)
      return Error{"--tensor-parallel: under " + std::string(name) + " one degree, or one per pipeline rank (" +
                   std::to_string(opts.stages) + " for --stages " + std::to_string(opts.stages) +
                   "), which its chunks share"};
    if (opts.microbatches > 0 && opts.microbatches % opts.stages != 0)
      return Error{"--microbatches: " + pipeline::interleavingProblem(pinned, opts.stages, opts.virtual_stages,
                                                                       opts.microbatches)};
  }
  return {};
}

Status finishProfileOptions(const ProfileFlags &flags, ProfileCommandOptions &opts) {
  for (int64_t b : opts.batch_sizes)
    if (b < 1) return Error{"--batch-sizes: sizes must be at least 1"};
  auto p = cost::parsePrecision(flags.precision);
  if (!p) return Error{"--precision: " + p.error().message};
  opts.precision = *p;
  auto kind = cluster::parseDeviceKind(flags.device);
  if (!kind) return Error{"--device " + kind.error().message};
  opts.device = *kind;
  auto optimizer = cost::parseOptimizer(flags.optimizer);
  if (!optimizer || (*optimizer != cost::Optimizer::Sgd && *optimizer != cost::Optimizer::Adam))
    return Error{"--optimizer must be sgd or adam (got '" + flags.optimizer + "')"};
  opts.optimizer = *optimizer;
  return {};
}

Status finishReestimateOptions(std::string_view device_memory, double margin, ReestimateOptions &opts) {
  if (Status st = parseDeviceMemory(device_memory, opts.device_memory); !st) return st;
  if (margin >= 0) opts.memory_margin = margin;
  return {};
}

} // namespace rannc::planner
