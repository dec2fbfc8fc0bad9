// Decide, then execute: what each rank does in a training step is data — a
// list of actions built here, printable and testable without MPI — and the
// runtime only interprets it.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "planner/ir/ir.h"

namespace rannc::schedule {

enum class ActionKind {
  RecvActivations, ///< receive this micro-batch's inputs from earlier stages
  Forward,
  SendActivations, ///< send this micro-batch's outputs to later stages
  RecvGradients,   ///< receive the gradients of the sent outputs
  Backward,
  SendGradients,   ///< send the gradients of the received inputs back
  OptimizerStep,
};

struct Action {
  ActionKind kind;
  int microbatch = -1; ///< -1 for OptimizerStep
  bool operator==(const Action &o) const { return kind == o.kind && microbatch == o.microbatch; }
};

std::string toString(const Action &a);
void print(const std::vector<Action> &actions, std::ostream &os);

/// GPipe fill-drain for `stage` of `num_stages`: all forwards, then all
/// backwards in reverse micro-batch order, then the optimizer step. The first
/// stage receives nothing and the last sends nothing forward.
std::vector<Action> gpipe(int stage, int num_stages, int microbatches);

/// Which values cross stage boundaries, and what each stage runs.
struct Transfer {
  ir::ValueId value;
  int peer_stage; ///< the producer (for receives) or the consumer (for sends)
};

struct StageProgram {
  int stage = 0;
  std::vector<ir::NodeId> nodes;         ///< in graph order
  std::vector<ir::ValueId> data_inputs;  ///< graph inputs this stage reads
  std::vector<ir::ValueId> parameters;   ///< parameters this stage reads
  std::vector<ir::ValueId> constants;    ///< constants this stage reads
  std::vector<Transfer> recvs;           ///< sorted by (peer stage, value id)
  std::vector<Transfer> sends;           ///< sorted by (peer stage, value id)
  bool computes_loss = false;
};

/// The program of `stage` given every stage's op range [begin, end).
/// Constant ops (no inputs) are cheap and recomputed by every stage that reads
/// them instead of being sent.
StageProgram buildStageProgram(const ir::Graph &g, const std::vector<std::pair<int, int>> &ranges, int stage);

} // namespace rannc::schedule
