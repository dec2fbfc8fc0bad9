// Note [progress lines]: the heartbeat says what planning is doing at least
// once an interval, waits a whole interval after any line, and is silent off.
#include <gtest/gtest.h>

#include <chrono>
#include <sstream>
#include <string>
#include <thread>

#include "planner/driver/progress.h"

namespace rannc::planner {
namespace {

int lines(const std::string &text, const std::string &with) {
  int n = 0;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) n += line.find(with) != std::string::npos;
  return n;
}

TEST(Heartbeat, SaysWhatItIsDoingEveryInterval) {
  std::ostringstream log;
  {
    Heartbeat beat(&log, 0.05, "rannc-plan: ");
    beat.doing("searching 12 blocks");
    std::this_thread::sleep_for(std::chrono::milliseconds(330)); // 6 intervals
  }
  const std::string text = log.str();
  // At least 3 of the 6 beats even on a loaded machine, each a whole line.
  EXPECT_GE(lines(text, "rannc-plan: searching 12 blocks ("), 3) << text;
  EXPECT_LE(lines(text, "rannc-plan: "), 7) << text;
  EXPECT_EQ(text.back(), '\n');
}

TEST(Heartbeat, ALineResetsTheInterval) {
  std::ostringstream log;
  {
    Heartbeat beat(&log, 0.25, "p: ");
    for (int i = 0; i < 6; ++i) { // a line every 0.1 s: no beat is due
      beat.say("step " + std::to_string(i));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_EQ(lines(log.str(), "p: step "), 6);
  EXPECT_EQ(lines(log.str(), "p: starting"), 0) << log.str();
}

TEST(Heartbeat, OffPrintsNothing) {
  std::ostringstream log;
  {
    Heartbeat beat(&log, 0, "p: ");
    beat.doing("x");
    beat.say("y");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_EQ(log.str(), "");
}

} // namespace
} // namespace rannc::planner
