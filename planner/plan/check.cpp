// The structural checks every consumer of a plan runs before trusting it
// (rannc-exec at start-up, rannc-plan check). They need only the plan: no
// model file, no cluster, no cost model.
//
// Note [plan structure]
// A plan is runnable when
//  - every op of graph.ops is in exactly one stage and the stages own
//    consecutive ranges in pipeline order (stage i+1 starts where stage i
//    ends), so the partitioner's block model applies to it;
//  - every value an op reads is computed by an earlier op of the same or an
//    earlier stage: values only ever flow forward through the pipeline (a
//    stage never waits for a later one, which would deadlock the schedule);
//  - the ranks are 0..W-1, each in exactly one stage (W = the number listed),
//    a stage of tensor-parallel degree t listing a multiple of t (replicas x t);
//    with virtual_stages v > 1 (interleaved 1F1B) the p v stages' stage k
//    lists exactly the ranks of stage k % p, and the first p stages hold
//    each rank once;
//  - the micro-batches divide the global batch and every replica gets samples.
// The checks collect every problem rather than stopping at the first, so a
// hand edit can be fixed in one go; each message starts with the plan field to
// edit.
#include <algorithm>
#include <map>
#include <set>
#include <tuple>
#include <unordered_map>

#include "planner/ir/weight_gradients.h"
#include "planner/plan/plan.h"

namespace rannc::plan {
namespace {

std::string opRef(const proto::Plan &plan, int i) {
  return std::to_string(i) + " '" + plan.graph().ops(i).name() + "'";
}

/// "[a, b) 'first' .. 'last'" for a run of ops.
std::string opRun(const proto::Plan &plan, int begin, int end) {
  std::string s =
      "[" + std::to_string(begin) + ", " + std::to_string(end) + ") '" + plan.graph().ops(begin).name() + "'";
  if (end - begin > 1) s += " .. '" + plan.graph().ops(end - 1).name() + "'";
  return s;
}

bool validRange(const proto::Stage &s, int num_ops) {
  return s.op_begin() >= 0 && s.op_end() <= num_ops && s.op_begin() < s.op_end();
}

/// Every op in exactly one stage, found by sorting the ranges (so swapped
/// stages are reported as out of order, not as gaps and overlaps).
void coverageProblems(const proto::Plan &plan, std::vector<std::string> &problems) {
  const int num_ops = plan.graph().ops_size();
  std::vector<std::tuple<int, int, int>> ranges; // begin, end, stage
  for (int i = 0; i < plan.stages_size(); ++i)
    if (validRange(plan.stages(i), num_ops)) ranges.emplace_back(plan.stages(i).op_begin(), plan.stages(i).op_end(), i);
  std::sort(ranges.begin(), ranges.end());
  int covered = 0, last = -1; // ops [0, covered) are in some stage; `last` ends furthest
  for (auto [begin, end, i] : ranges) {
    const std::string where = "stages[" + std::to_string(i) + "].op_begin: is " + std::to_string(begin) +
                              ", expected " + std::to_string(covered);
    if (begin > covered) problems.push_back(where + " (ops in no stage: " + opRun(plan, covered, begin) + ")");
    if (begin < covered)
      problems.push_back(where + " (ops in two stages, " + std::to_string(last) + " and " + std::to_string(i) + ": " +
                         opRun(plan, begin, std::min(end, covered)) + ")");
    if (end > covered) {
      covered = end;
      last = i;
    }
  }
  if (last >= 0 && covered < num_ops)
    problems.push_back("stages[" + std::to_string(last) + "].op_end: is " + std::to_string(covered) +
                       ", the graph has " + std::to_string(num_ops) +
                       " ops (ops in no stage: " + opRun(plan, covered, num_ops) + ")");
  for (int i = 1; i < plan.stages_size(); ++i) {
    const auto &a = plan.stages(i - 1), &b = plan.stages(i);
    if (validRange(a, num_ops) && validRange(b, num_ops) && b.op_begin() < a.op_begin())
      problems.push_back("stages[" + std::to_string(i) + "]: op range [" + std::to_string(b.op_begin()) + ", " +
                         std::to_string(b.op_end()) + ") comes before stage " + std::to_string(i - 1) + "'s [" +
                         std::to_string(a.op_begin()) + ", " + std::to_string(a.op_end()) +
                         "); stages must own consecutive op ranges in pipeline order");
  }
}

/// A floating-point value whose samples are mixed along its batch axis
/// (batch_blocks -1, Note [batch layout]) cannot be split between replicas:
/// it may cross only between stages with equal replica counts (non-floating
/// values are recomputed, Note [recomputed values]).
void unsplittable(const proto::Plan &plan, const proto::Op &producer, const std::string &value, int from, int to,
                  std::vector<std::string> &problems) {
  const int a = stageReplicas(plan.stages(from)), b = stageReplicas(plan.stages(to));
  if (a == b) return;
  for (const auto &out : producer.outputs())
    if (auto dtype = ir::parseDType(out.dtype());
        out.name() == value && out.batch_blocks() < 0 && dtype && ir::isFloating(*dtype))
      problems.push_back("stages[" + std::to_string(to) + "]: reads '" + value + "' from stage " +
                         std::to_string(from) + ", but its samples are mixed along its batch axis (an op such as "
                         "BatchNorm couples them), so it cannot be split between " + std::to_string(a) + " and " +
                         std::to_string(b) + " replicas; move the boundary or give both stages the same replicas");
}

/// Values flow forward: through the op order (topological) and through the
/// stages (an op reads only what its own or an earlier stage computes).
void dependencyProblems(const proto::Plan &plan, std::vector<std::string> &problems) {
  const auto &graph = plan.graph();
  const int num_ops = graph.ops_size();
  std::unordered_map<std::string, int> producer; // value -> op; -1 for declared values
  for (const auto &v : graph.values()) producer.emplace(v.name(), -1);
  std::vector<int> owners(num_ops, 0), stage_of(num_ops, -1);
  for (int s = 0; s < plan.stages_size(); ++s)
    if (validRange(plan.stages(s), num_ops))
      for (int n = plan.stages(s).op_begin(); n < plan.stages(s).op_end(); ++n) {
        ++owners[n];
        stage_of[n] = s;
      }
  for (int n = 0; n < num_ops; ++n)
    if (owners[n] != 1) stage_of[n] = -1; // reported by coverageProblems
  for (int n = 0; n < num_ops; ++n)
    for (const auto &out : graph.ops(n).outputs())
      if (!out.name().empty() && !producer.emplace(out.name(), n).second)
        problems.push_back("graph.ops[" + opRef(plan, n) + "]: output '" + out.name() + "' is already " +
                           (producer[out.name()] < 0
                                ? "declared in graph.values"
                                : "computed by graph.ops[" + opRef(plan, producer[out.name()]) + "]"));

  // Backward flows between stages are summarised per (reader, producer) pair:
  // a swapped pair of stages breaks hundreds of edges, one line says it.
  struct Backflow {
    int count = 0;
    std::string example;
  };
  std::map<std::pair<int, int>, Backflow> backflows;
  std::set<std::pair<std::string, int>> crossings; // (value, reader stage), each checked once
  int order_errors = 0;
  constexpr int kMaxOrderErrors = 10;
  for (int n = 0; n < num_ops; ++n)
    for (const auto &in : graph.ops(n).inputs()) {
      if (in.empty()) continue;
      auto it = producer.find(in);
      if (it == producer.end()) {
        if (++order_errors <= kMaxOrderErrors)
          problems.push_back("graph.ops[" + opRef(plan, n) + "]: input '" + in +
                             "' is neither declared in graph.values nor computed by an op");
        continue;
      }
      const int p = it->second;
      if (p < 0) continue; // graph input, parameter or constant
      if (p >= n) {
        if (++order_errors <= kMaxOrderErrors)
          problems.push_back("graph.ops[" + opRef(plan, n) + "]: reads '" + in + "' before graph.ops[" +
                             opRef(plan, p) + "] computes it (graph.ops must be in topological order)");
        continue;
      }
      if (stage_of[n] >= 0 && stage_of[p] >= 0 && stage_of[p] < stage_of[n] &&
          crossings.insert({in, stage_of[n]}).second)
        unsplittable(plan, graph.ops(p), in, stage_of[p], stage_of[n], problems);
      if (stage_of[n] >= 0 && stage_of[p] > stage_of[n]) {
        Backflow &b = backflows[{stage_of[n], stage_of[p]}];
        if (b.count++ == 0) b.example = "op " + opRef(plan, n) + " reads '" + in + "' from op " + opRef(plan, p);
      }
    }
  if (order_errors > kMaxOrderErrors)
    problems.push_back("graph.ops: " + std::to_string(order_errors - kMaxOrderErrors) + " more inputs out of order");
  for (const auto &[pair, b] : backflows)
    problems.push_back("stages[" + std::to_string(pair.first) + "]: reads " + std::to_string(b.count) +
                       (b.count == 1 ? " value" : " values") + " that stage " + std::to_string(pair.second) +
                       " computes later in the pipeline (stages out of dependency order), e.g. " + b.example);
}

void rankProblems(const proto::Plan &plan, std::vector<std::string> &problems) {
  std::map<int, int> seen; // rank -> its first stage
  const int world = worldSize(plan);
  const int v = virtualStages(plan), p = pipelineRanks(plan);
  if (v > 1) { // Note [interleaved 1F1B]
    if (plan.stages_size() % v != 0)
      problems.push_back("virtual_stages: " + std::to_string(v) + " does not divide the " +
                         std::to_string(plan.stages_size()) + " stages");
    for (int i = p; i < plan.stages_size() && plan.stages_size() % v == 0; ++i)
      if (!std::equal(plan.stages(i).ranks().begin(), plan.stages(i).ranks().end(), plan.stages(i % p).ranks().begin(),
                      plan.stages(i % p).ranks().end()))
        problems.push_back("stages[" + std::to_string(i) + "].ranks: under virtual_stages " + std::to_string(v) +
                           " stage " + std::to_string(i) + " runs on the ranks of stage " + std::to_string(i % p) +
                           " and must list them alike");
  }
  for (int i = 0; i < (v > 1 ? p : plan.stages_size()); ++i)
    for (int r : plan.stages(i).ranks()) {
      std::string where = "stages[" + std::to_string(i) + "].ranks";
      if (r < 0 || r >= world)
        problems.push_back(where + ": rank " + std::to_string(r) + " is outside 0.." + std::to_string(world - 1) +
                           " (the stages list " + std::to_string(world) + " ranks)");
      else if (auto [it, fresh] = seen.emplace(r, i); !fresh)
        problems.push_back(where + ": rank " + std::to_string(r) +
                           (it->second == i ? " is listed twice" : " is used by more than one stage"));
    }
  std::string missing;
  int num_missing = 0;
  for (int r = 0; r < world; ++r)
    if (!seen.count(r)) {
      if (++num_missing <= 8) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
    }
  if (num_missing > 0)
    problems.push_back("stages[*].ranks: rank" + std::string(num_missing > 1 ? "s " : " ") + missing +
                       (num_missing > 8 ? ", ..." : "") + " in no stage (the stages list " + std::to_string(world) +
                       " ranks, which must be 0.." + std::to_string(world - 1) + " once each)");
}

/// A split backward's W runs root by root (Note [split backward] in
/// executor/runtime/stage.cpp): a stage whose parameter two of its
/// weight-gradient roots reach (tied weights in one stage) cannot split.
void weightRootProblems(const proto::Plan &plan, pipeline::Schedule schedule, std::vector<std::string> &problems) {
  auto g = graphFromProto(plan.graph());
  if (!g) return; // reported elsewhere
  for (int i = 0; i < plan.stages_size(); ++i) {
    const auto &s = plan.stages(i);
    if (!validRange(s, int(g->nodes.size()))) continue;
    std::vector<ir::NodeId> nodes;
    for (int n = s.op_begin(); n < s.op_end(); ++n) nodes.push_back(n);
    const ir::StageWeightRoots found = ir::stageWeightRoots(*g, nodes);
    if (!found.conflict.empty())
      problems.push_back("stages[" + std::to_string(i) + "]: " + pipeline::scheduleName(schedule) +
                         " needs each parameter read by one op of a stage (its weight gradients run op by op), but " +
                         found.conflict + "; use 1f1b, or put them in different stages");
  }
}

void batchProblems(const proto::Plan &plan, std::vector<std::string> &problems) {
  if (plan.global_batch_size() < 1) problems.push_back("global_batch_size: must be at least 1");
  if (plan.microbatches() < 1)
    problems.push_back("microbatches: must be at least 1");
  else if (plan.global_batch_size() % plan.microbatches() != 0)
    problems.push_back("microbatches: " + std::to_string(plan.microbatches()) + " does not divide global_batch_size " +
                       std::to_string(plan.global_batch_size()));
  if (auto schedule = scheduleFromProto(plan.schedule()); !schedule) {
    problems.push_back(schedule.error().message);
  } else if (std::string why = pipeline::interleavingProblem(*schedule, pipelineRanks(plan), virtualStages(plan),
                                                             plan.microbatches());
             !why.empty()) {
    problems.push_back("virtual_stages: " + why);
  } else if (const int v = virtualStages(plan), p = pipelineRanks(plan); v > 1) { // Note [interleaved 1F1B]
    for (int i = p; i < plan.stages_size() && plan.stages_size() % v == 0; ++i) // a chunk runs in its rank's groups
      if (tensorParallel(plan.stages(i)) != tensorParallel(plan.stages(i % p)))
        problems.push_back("stages[" + std::to_string(i) + "].tensor_parallel: " +
                           std::to_string(tensorParallel(plan.stages(i))) + ", but under virtual_stages " +
                           std::to_string(v) + " stage " + std::to_string(i) + " runs in the groups of stage " +
                           std::to_string(i % p) + ", " + std::to_string(tensorParallel(plan.stages(i % p))) + "-way");
  } else if (pipeline::splitsBackward(*schedule)) { // Note [split backward] in executor/runtime/stage.cpp
    // Recomputing and tensor-parallel stages split their backward too (Note
    // [recomputing split backward] in planner/partition/evaluate.cpp).
    weightRootProblems(plan, *schedule, problems);
  }
  if (plan.microbatches() >= 1 && plan.global_batch_size() >= 1 && plan.global_batch_size() % plan.microbatches() == 0)
    for (int i = 0; i < plan.stages_size(); ++i)
      if (stageReplicas(plan.stages(i)) > plan.global_batch_size() / plan.microbatches())
        problems.push_back("stages[" + std::to_string(i) + "].ranks: " + std::to_string(stageReplicas(plan.stages(i))) +
                           " replicas for micro-batches of " +
                           std::to_string(plan.global_batch_size() / plan.microbatches()) +
                           " samples leaves a replica without samples");
  for (std::string &p : batchStatisticsProblems(plan)) problems.push_back(std::move(p));
}

} // namespace

std::vector<std::string> structuralProblems(const proto::Plan &plan) {
  std::vector<std::string> problems;
  if (plan.format_version() == 0 || plan.format_version() > kFormatVersion)
    problems.push_back("format_version: " + std::to_string(plan.format_version()) +
                       " is not a version this rannc reads (1.." + std::to_string(kFormatVersion) + ")");
  else
    for (const VersionedField &f : versionedFields(plan)) // Note [plan format versions]
      if (f.version > plan.format_version())
        problems.push_back(f.field + " needs format_version " + std::to_string(f.version) + ", the plan says " +
                           std::to_string(plan.format_version()) + " (a rannc that reads only version " +
                           std::to_string(plan.format_version()) + " would " + f.older_reader +
                           "); set format_version: " + std::to_string(f.version) +
                           ", or let rannc-plan convert write it");
  const int num_ops = plan.graph().ops_size();
  if (num_ops == 0) problems.push_back("graph.ops: the graph has no ops");
  if (plan.stages_size() == 0) problems.push_back("stages: the plan has no stages");
  if (const std::string &p = plan.precision(); !p.empty() && p != "fp32" && p != "bf16" && p != "fp16")
    problems.push_back("precision: '" + p + "' is not fp32, bf16 or fp16");
  for (int i = 0; i < plan.stages_size(); ++i) {
    const auto &s = plan.stages(i);
    std::string where = "stages[" + std::to_string(i) + "]";
    if (s.id() != i)
      problems.push_back(where + ".id: is " + std::to_string(s.id()) + ", expected " + std::to_string(i));
    if (s.op_end() <= s.op_begin())
      problems.push_back(where + ": op range [" + std::to_string(s.op_begin()) + ", " + std::to_string(s.op_end()) +
                         ") is empty");
    else if (s.op_begin() < 0 || s.op_end() > num_ops)
      problems.push_back(where + ": op range [" + std::to_string(s.op_begin()) + ", " + std::to_string(s.op_end()) +
                         ") is outside the graph's ops [0, " + std::to_string(num_ops) + ")");
    if (s.ranks_size() == 0) problems.push_back(where + ".ranks: the stage has no ranks");
    if (s.tensor_parallel() < 0)
      problems.push_back(where + ".tensor_parallel: is " + std::to_string(s.tensor_parallel()) +
                         ", expected a degree of at least 1");
    else if (s.ranks_size() % tensorParallel(s) != 0)
      problems.push_back(where + ".ranks: " + std::to_string(s.ranks_size()) + " ranks are not replicas x " +
                         "tensor_parallel " + std::to_string(tensorParallel(s)) + "; list a multiple of " +
                         std::to_string(tensorParallel(s)) + " ranks");
    if (s.zero() != 0 && s.zero() != 1)
      problems.push_back(where + ".zero: is " + std::to_string(s.zero()) + ", expected 0 or 1 (ZeRO stage)");
    else if (s.zero() == 1 && stageReplicas(s) < 2)
      problems.push_back(where + ".zero: 1 shards the optimizer state over the stage's replicas, but it has " +
                         std::to_string(stageReplicas(s)) + "; set zero: 0 or give it more ranks");
  }
  coverageProblems(plan, problems);
  dependencyProblems(plan, problems);
  rankProblems(plan, problems);
  batchProblems(plan, problems);
  if (plan.model().sha256().size() != 64) problems.push_back("model.sha256: not a SHA-256 hex digest");
  return problems;
}

} // namespace rannc::plan
