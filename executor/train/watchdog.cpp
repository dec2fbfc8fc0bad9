#include "executor/train/watchdog.h"

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

} // namespace rannc::train
