#include "executor/train/watchdog.h"

#include <csignal>
#include <iostream>
#include <utility>

namespace rannc::train {

Watchdog::Watchdog(double timeout_s, comm::Communicator &comm) : timeout_s_(timeout_s), comm_(comm) {
  if (timeout_s_ > 0) thread_ = std::thread([this] { watch(); });
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::progress(std::string what) {
  std::lock_guard<std::mutex> lock(mu_);
  last_ = std::chrono::steady_clock::now();
  what_ = std::move(what);
}

void Watchdog::watch() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!done_) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_).count();
    if (!done_ && idle > timeout_s_) {
      std::cerr << "rannc-exec: rank " << comm_.rank() << ": error: no progress for " << int(idle) << " s while "
                << what_ << " (--timeout " << timeout_s_ << "); stopping all ranks" << std::endl;
      comm_.abort(1);
    }
  }
}

namespace {
volatile std::sig_atomic_t g_stop_signal = 0;
extern "C" void onStopSignal(int sig) { g_stop_signal = sig; }
} // namespace

void installStopHandlers() {
  struct sigaction sa {};
  sa.sa_handler = onStopSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; // blocking calls (MPI, file writes) carry on; the step finishes
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
}

int stopRequested(comm::Communicator &comm) {
  double sig = double(g_stop_signal);
  comm.allReduce(&sig, 1, comm::ReduceOp::Max);
  return int(sig);
}

} // namespace rannc::train
