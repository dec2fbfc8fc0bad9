#include "planner/driver/progress.h"

#include <cstdio>

namespace rannc::planner {

Heartbeat::Heartbeat(std::ostream *log, double interval_s, std::string prefix)
    : log_(interval_s > 0 ? log : nullptr), interval_(interval_s), prefix_(std::move(prefix)) {
  if (log_) thread_ = std::thread([this] { run(); });
}

Heartbeat::~Heartbeat() {
  if (!log_) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Heartbeat::doing(std::string what) {
  if (!log_) return;
  std::lock_guard<std::mutex> lock(mu_);
  doing_ = std::move(what);
}

void Heartbeat::say(const std::string &line) {
  if (!log_) return;
  std::lock_guard<std::mutex> lock(mu_);
  *log_ << prefix_ << line << "\n" << std::flush;
  last_ = Clock::now();
}

void Heartbeat::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto due = last_ + std::chrono::duration_cast<Clock::duration>(interval_);
    if (cv_.wait_until(lock, due, [this] { return stop_; })) break;
    const auto now = Clock::now();
    if (now < last_ + std::chrono::duration_cast<Clock::duration>(interval_)) continue; // said something meanwhile
    char elapsed[32];
    std::snprintf(elapsed, sizeof elapsed, " (%.0f s)", std::chrono::duration<double>(now - start_).count());
    *log_ << prefix_ << doing_ << elapsed << "\n" << std::flush;
    last_ = now;
  }
}

} // namespace rannc::planner
