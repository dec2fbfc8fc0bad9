// rannc-exec's training loop: load the plan, this rank's stage, its weights
// and data, then run the schedule step after step and log.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>

#include "executor/comm/comm.h"
#include "planner/support/status.h"

namespace rannc::train {

struct TrainOptions {
  std::string plan;
  std::string model;      ///< overrides the model path the plan names
  std::string data_dir;
  bool synthetic = false;
  int64_t steps = 10;
  std::string optimizer = "sgd"; ///< sgd | adam
  double lr = 0.01;
  std::string shuffle = "off";   ///< off | on
  uint64_t seed = 0;
  std::string log;        ///< JSONL file written by rank 0; empty: none
  double timeout_s = 300; ///< a rank that makes no progress this long stops the job (0: never)
  std::string on_nonfinite = "stop"; ///< stop | skip: what a non-finite gradient does
  std::string device;     ///< "cpu" runs a plan made for CUDA devices on CPU; empty: the plan's
  bool progress = true;   ///< a line per step on stderr (rank 0)
};

/// Trains on every rank of `comm`. Start-up problems (plan, world size, model
/// hash, data) are agreed on by all ranks before the first step: every rank
/// returns an error, and only the first failing rank's message is non-empty.
Status train(const TrainOptions &opts, comm::Communicator &comm, std::ostream &log);

} // namespace rannc::train
