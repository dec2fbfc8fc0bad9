// The planner's entry points, one per rannc-plan verb. The tool only parses
// flags into these option structs; tests call the same functions in-process.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "plan.pb.h"
#include "planner/cluster/cluster.h"
#include "planner/cluster/device_kind.h"
#include "planner/cost/cost.h"
#include "planner/cost/precision.h"
#include "planner/driver/options.h"
#include "planner/import/model_format.h"
#include "planner/ir/ir.h"
#include "planner/partition/evaluate.h"
#include "planner/pipeline/schedule.h"
#include "planner/sharding/sharding.h"
#include "planner/support/status.h"

namespace rannc::planner {

/// Measures unit costs at the given micro-batch sizes on `device` (the CPU,
/// or this machine's GPU) (the LibTorch profiler; the driver is torch-free,
/// so the tool passes it in).
using MeasureFn = std::function<Expected<cost::CostTable>(const ir::Graph &, const std::vector<cost::Unit> &,
                                                          const std::vector<int64_t> &batch_sizes,
                                                          cluster::DeviceKind device)>;

/// Fills the shapes ONNX's own shape inference left unknown in a graph
/// imported from `model` (by running it with LibTorch); how many it set.
using ShapeFn = std::function<Expected<int>(ir::Graph &g, const std::string &model)>;

/// The front ends that need LibTorch, which the tool passes in; an unset one
/// refuses TorchScript and torch.export, or leaves unknown ONNX shapes unknown.
struct FrontEnds {
  import::TorchImporters torch; ///< TorchScript (.pt) and torch.export (.pt2), Note [import layering]
  ShapeFn onnx_shapes;
  /// Fuse an ONNX graph's decomposed kernels at import (Note [pattern fusion]); --no-fuse clears it.
  bool fuse = true;
};

struct PlanOptions {
  std::string model;
  std::string output;
  int gpus = 1;
  std::string device_type = "cpu";
  std::string cluster_file; ///< a YAML cluster description; replaces gpus/device_type
  std::optional<int64_t> device_memory;
  int64_t batch_size = 32;
  // The search space (RaNNC's partition_num / replica_num / pipeline_num):
  // 0 or empty means the partitioner chooses.
  int microbatches = 0;
  int stages = 0;             ///< pipeline ranks (each runs virtual_stages stages)
  int virtual_stages = 1;     ///< chunks per pipeline rank (--virtual-stages; interleaved-1f1b only)
  std::vector<int> replicas;   ///< one count for every stage, or one per stage
  /// Tensor-parallel degrees (--tensor-parallel): empty (auto): the degrees
  /// the model's sharding allows, up to devices per node, chosen per stage;
  /// one degree for every stage, or one per stage.
  std::vector<int> tensor_parallel;
  std::optional<pipeline::Schedule> schedule; ///< unset: searched
  /// With `schedule` unset, the search weighs every schedule (the default,
  /// --schedule auto); false: 1F1B alone (Note [schedule default] in planner/driver/lower.cpp).
  bool auto_schedule = true;
  Recompute recompute = Recompute::Auto; ///< Auto: chosen per stage where memory needs it
  Zero zero = Zero::Auto;                ///< Auto: sharded per stage where memory needs it
  cost::Precision precision = cost::Precision::FP32; ///< compute under autocast (Note [autocast dtypes])
  /// --batchnorm exact: single-device batch statistics (Note [batch statistics]).
  bool exact_batchnorm = false;
  bool power_of_two_replicas = false;
  std::string strategy = "auto"; ///< auto (the DP) | uniform | parameters | time
  double memory_margin = 0.1;  ///< fraction of device memory kept free
  cost::Optimizer optimizer = cost::Optimizer::Adam; ///< what the memory estimate assumes
  /// Cost source: "measure", "analytic", a profile file, or "" for the
  /// default (measured when the device type is this machine's, else analytic).
  std::string profile;
  int threads = 1; ///< intra-op threads per rank (what measured costs assume)
  MeasureFn measure; ///< unset: measuring is unavailable
  FrontEnds front_ends;
  std::string data_dir;        ///< --data: a TorchScript archive's inputs from DIR/<input>.npy
  /// > 0: runPlan prints what it is doing at least this often (Note [progress lines] in progress.h).
  double progress_interval_s = 0;
  std::function<void(const std::string &)> doing; ///< told each phase of planning; unset: nothing
};

struct ProfileCommandOptions {
  std::string model;
  std::string data_dir; ///< as PlanOptions::data_dir
  std::string output;
  std::vector<int64_t> batch_sizes{1, 2, 4, 8};
  int threads = 1;
  cost::Precision precision = cost::Precision::FP32; ///< measure under autocast (as PlanOptions::precision)
  cluster::DeviceKind device = cluster::DeviceKind::Cpu; ///< where to measure (cuda: this machine's GPU)
  cost::Optimizer optimizer = cost::Optimizer::Adam;     ///< whose step time to measure (sgd or adam)
  /// The device name plans made from the profile target (a preset or a
  /// cluster file's device.name); with --device cuda it must be given.
  std::string device_type;
  FrontEnds front_ends;
};

/// The cluster the options describe: a cluster file, or --gpus devices of a preset.
Expected<cluster::ClusterSpec> clusterFor(const PlanOptions &opts);

/// Imports the model, lowers it with its costs and the cluster to a partition
/// Problem, solves it (stages, replicas, micro-batches, schedule, recomputation,
/// ZeRO) and returns the plan (without writing it).
Expected<proto::Plan> makePlan(const PlanOptions &opts, std::ostream &log);

/// Builds a plan for an imported graph from a cost table over its units: the
/// pure part of makePlan. With `log`, says what the search took. With the
/// sharding `analysis` of `g`, stages may be tensor-parallel (Note [tensor
/// parallel lowering]); a plan that uses it records the analysis in its graph.
Expected<proto::Plan> planGraph(const ir::Graph &g, const cost::CostTable &costs,
                                const cluster::ClusterSpec &cluster, const PlanOptions &opts,
                                const std::string &model_sha256, std::ostream *log = nullptr,
                                const sharding::Analysis *analysis = nullptr);

/// Sets the model's forward and training FLOPs per sample (Note [flop counts]).
void fillModelFlops(const ir::Graph &g, proto::Estimates *e);

/// Fills a stage's estimates from the partitioner's evaluation of it (planGraph
/// and `check --update` both use it, so plans always carry the same fields).
/// `split_backward`: the plan's schedule splits the backward (its W's time and queue are written);
/// `rank_peak_bytes` > 0: an interleaved plan's figure for the stage's rank (Evaluation::rank_peak_memory_bytes).
void fillStageEstimates(const partition::StageCost &c, double capacity_bytes, int64_t num_params, bool split_backward,
                        double rank_peak_bytes, proto::StageEstimates *e);

/// The micro-batch sizes a plan needs costs at.
std::vector<int64_t> costBatchSizes(const PlanOptions &opts);

/// rannc-plan MODEL ... -o PLAN
Status runPlan(const PlanOptions &opts, std::ostream &out, std::ostream &log);
/// rannc-plan show PLAN [--json]
Status runShow(const std::string &plan_path, bool json, std::ostream &out);
/// rannc-plan profile MODEL -o PROFILE (measure is the LibTorch profiler)
Status runProfile(const ProfileCommandOptions &opts, const MeasureFn &measure, std::ostream &log);
/// rannc-plan import MODEL [--tensor-parallel N]: the graph IR; with N > 0 also
/// the tensor-parallel analysis and the valid degrees up to N.
Status runImport(const std::string &model_path, const std::string &data_dir, const FrontEnds &front_ends,
                 std::ostream &out, std::ostream &log, int tensor_parallel = 0);

} // namespace rannc::planner
