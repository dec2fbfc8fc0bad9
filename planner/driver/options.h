// rannc-plan's options typed at the edge: the flag text a user types (enum
// words, sizes, which flags were given) is checked and turned into the
// driver's option structs here, once, so tests that call the verbs
// in-process pass the same checks as the tool.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "planner/support/status.h"

namespace rannc::planner {

struct PlanOptions;
struct ProfileCommandOptions;
struct ReestimateOptions;

/// --recompute: per stage where activations would not fit, every stage, or none.
enum class Recompute { Auto, On, Off };
/// --zero: optimizer state sharded over a stage's replicas (ZeRO-1) where memory needs it, never (0), always (1).
enum class Zero { Auto, Off, On };

/// Parses "auto", "on" or "off".
Expected<Recompute> parseRecompute(std::string_view text);
/// Parses "auto", "0" or "1".
Expected<Zero> parseZero(std::string_view text);
/// Parses --tensor-parallel: "auto" (empty: the degrees the model allows, up to
/// a node), "N" (every stage N) or "N1,N2,..." (one per stage); each >= 1.
Expected<std::vector<int>> parseTensorParallel(std::string_view text);
/// The words each option reads, in the order --help lists them.
std::vector<std::string> recomputeNames();
std::vector<std::string> zeroNames();
std::vector<std::string> scheduleNames();
std::vector<std::string> batchNormNames();

/// The rannc-plan flags that are text, or that matter by being given at all.
struct PlanFlags {
  bool devices_given = false;     ///< --gpus or --device-type was given (a cluster file describes the devices)
  std::string device_memory;      ///< --device-memory, e.g. "2GiB"; empty: the preset's or the file's
  std::string precision = "fp32"; ///< fp32 | bf16 | fp16
  std::string recompute = "auto"; ///< auto | on | off
  std::string zero = "auto";      ///< auto | 0 | 1
  std::string tensor_parallel = "auto"; ///< auto | N | N1,N2,... (--tensor-parallel, --tp)
  std::string schedule = "auto";  ///< auto (or empty): the partitioner weighs every schedule (Note [schedule default]); else a pipeline::scheduleName
  std::string optimizer = "adam"; ///< a cost::optimizerName
  std::string batchnorm = "local"; ///< local | exact (Note [batch statistics] in planner/plan/batch_statistics.cpp)
};
/// Checks `flags` against `opts` and sets its typed fields; the error names the flag.
Status finishPlanOptions(const PlanFlags &flags, PlanOptions &opts);

/// The rannc-plan profile flags that are words.
struct ProfileFlags {
  std::string precision = "fp32"; ///< fp32 | bf16 | fp16
  std::string device = "cpu";     ///< cpu | cuda
  std::string optimizer = "adam"; ///< sgd | adam
};
/// Checks rannc-plan profile's batch sizes and sets its typed fields from `flags`.
Status finishProfileOptions(const ProfileFlags &flags, ProfileCommandOptions &opts);

/// Sets the re-estimating verbs' --device-memory (empty: not given) and
/// --memory-margin (negative: not given, the plan's own).
Status finishReestimateOptions(std::string_view device_memory, double margin, ReestimateOptions &opts);

} // namespace rannc::planner
