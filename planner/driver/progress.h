// Progress while planning: a line at least every couple of seconds saying
// what rannc-plan is doing (Note [progress lines]).
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>

namespace rannc::planner {

/// Note [progress lines]
/// Planning a large cluster searches for seconds, and measuring a large
/// model's units for minutes, and a silent tool looks hung. The planner's
/// phases and the search's own steps only say what they are doing
/// (PlanOptions::doing, DPOptions::doing); a heartbeat thread prints that,
/// with the time so far, whenever no line went out for an interval (2 s by
/// default; rannc-plan --quiet turns it off). It writes to the tool's stderr
/// only: library callers (tests) get no thread unless they ask for one.
class Heartbeat {
public:
  /// Prints to `log` every `interval_s` without another line; null or an
  /// interval <= 0: off (every call returns at once).
  Heartbeat(std::ostream *log, double interval_s, std::string prefix);
  ~Heartbeat();
  Heartbeat(const Heartbeat &) = delete;
  Heartbeat &operator=(const Heartbeat &) = delete;
  /// What the next beat says.
  void doing(std::string what);
  /// Prints `line` now (as a beat would), and the next beat waits a whole interval.
  void say(const std::string &line);

private:
  void run();

  using Clock = std::chrono::steady_clock;
  std::ostream *log_;
  std::chrono::duration<double> interval_;
  std::string prefix_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::string doing_ = "starting";
  Clock::time_point start_ = Clock::now(), last_ = start_;
  std::thread thread_;
};

} // namespace rannc::planner
