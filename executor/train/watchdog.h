// The watchdog thread: a rank that makes no progress for --timeout seconds
// stops the whole job with what it was waiting for (SPEC: none hangs).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

#include "executor/comm/comm.h"

namespace rannc::train {

/// Stops the whole job when this rank makes no progress for `timeout_s`
/// (a peer that died without MPI noticing, a lost message): never a hang.
class Watchdog {
public:
  /// `timeout_s` <= 0: never.
  Watchdog(double timeout_s, comm::Communicator &comm);
  ~Watchdog();
  Watchdog(const Watchdog &) = delete;
  Watchdog &operator=(const Watchdog &) = delete;
  /// Records progress and what the rank is about to wait for.
  void progress(std::string what);

private:
  void watch();

  double timeout_s_;
  comm::Communicator &comm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  std::chrono::steady_clock::time_point last_ = std::chrono::steady_clock::now();
  std::string what_ = "starting";
  std::thread thread_;
};

/// Note [graceful stop]
/// SIGTERM (a scheduler's preemption, mpirun's forwarding) and SIGINT only set
/// a flag; the trainer asks stopRequested after each step, a collective, so
/// every rank stops after the same step. It then writes a checkpoint of that
/// step when --checkpoint-dir is given (unless one was just written) and
/// exits non-zero saying so: at most the step in flight is redone on --resume.

/// Installs the SIGTERM and SIGINT handlers of Note [graceful stop].
void installStopHandlers();
/// Collective: the signal some rank received (the largest number), or 0.
int stopRequested(comm::Communicator &comm);

} // namespace rannc::train
