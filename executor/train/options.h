// rannc-exec's options typed at the edge: the flag text and units a user
// types are checked and turned into TrainOptions here, once, so tests that
// call train() in-process pass the same checks as the tool.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "executor/comm/rehearsal.h"
#include "planner/support/status.h"

namespace rannc::train {

struct TrainOptions;

/// --optimizer: torch.optim's SGD, Adam or AdamW.
enum class OptimizerKind { Sgd, Adam, AdamW };
/// Parses "sgd", "adam" or "adamw".
Expected<OptimizerKind> parseOptimizer(std::string_view text);
/// The word parseOptimizer reads (logs and checkpoint manifests show it).
std::string optimizerName(OptimizerKind k);

/// --shuffle: samples in file order, or a seeded permutation per epoch.
enum class Shuffle { Off, On };
/// Parses "off" or "on".
Expected<Shuffle> parseShuffle(std::string_view text);
/// The word parseShuffle reads (checkpoint manifests record it).
std::string shuffleName(Shuffle s);

/// The rannc-exec flags whose text or unit differs from TrainOptions's.
struct ExecFlags {
  double bucket_mib = 25;             ///< --bucket-size, MiB
  std::string gpu_transport = "nccl"; ///< nccl | host | rehearsal
  std::string rehearsal;              ///< the environment's RANNC_REHEARSAL: "stall=S,swap=RANK:CALL" (tests)
  std::optional<std::string> betas;   ///< --betas B1,B2
  std::string shuffle = "off";        ///< off | on
  std::string optimizer;              ///< sgd | adam | adamw; empty: the plan's (planOptimizer)
  std::string device;                 ///< cpu | cuda; empty: the plan's
};

/// The optimizer the plan at `plan_path` assumed (rannc-plan --optimizer;
/// its "momentum" is SGD), and SGD when the plan names none or cannot be read
/// (the run then reports the plan). rannc-exec's default: the memory the plan
/// promises is that of the optimizer that runs.
OptimizerKind planOptimizer(const std::string &plan_path);

/// Parses "B1,B2" (two numbers and nothing else).
Expected<std::pair<double, double>> parseBetas(std::string_view text);

/// Parses RANNC_REHEARSAL's "stall=S,swap=RANK:CALL" (either part may be
/// left out) over the defaults of comm::RehearsalOptions.
Expected<comm::RehearsalOptions> parseRehearsal(std::string_view text);

/// Gradient bucket bytes for a size in MiB (at least one byte).
int64_t bucketBytes(double mib);

/// Checks `flags` and sets the TrainOptions fields they stand for; the error names the flag.
Status finishTrainOptions(const ExecFlags &flags, TrainOptions &opts);

} // namespace rannc::train
