#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "executor/schedule/schedule.h"
#include "planner/import/onnx_import.h"

namespace rannc::schedule {
namespace {

std::string str(const std::vector<Action> &a) {
  std::ostringstream os;
  print(a, os);
  return os.str();
}

TEST(GPipe, FirstMiddleAndLastStage) {
  EXPECT_EQ(str(gpipe(0, 3, 2)), "forward(0) send-act(0) forward(1) send-act(1) recv-grad(1) backward(1) "
                                 "recv-grad(0) backward(0) optimizer-step\n");
  EXPECT_EQ(str(gpipe(1, 3, 2)), "recv-act(0) forward(0) send-act(0) recv-act(1) forward(1) send-act(1) "
                                 "recv-grad(1) backward(1) send-grad(1) recv-grad(0) backward(0) send-grad(0) "
                                 "optimizer-step\n");
  EXPECT_EQ(str(gpipe(2, 3, 2)), "recv-act(0) forward(0) recv-act(1) forward(1) backward(1) send-grad(1) "
                                 "backward(0) send-grad(0) optimizer-step\n");
  EXPECT_EQ(str(gpipe(0, 1, 1)), "forward(0) backward(0) optimizer-step\n");
}

TEST(StageProgram, EverySendHasAMatchingReceive) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  auto g = import::importModel(std::string(dir ? dir : "models") + "/gpt/model.onnx");
  ASSERT_TRUE(g.ok()) << g.error().message;
  const int n = static_cast<int>(g->nodes.size());
  std::vector<std::pair<int, int>> ranges{{0, n / 4}, {n / 4, n / 2}, {n / 2, 3 * n / 4}, {3 * n / 4, n}};
  std::set<std::tuple<int, int, ir::ValueId>> sent, received; // (from, to, value)
  std::set<ir::NodeId> computed;
  int loss_stages = 0;
  for (int s = 0; s < 4; ++s) {
    StageProgram p = buildStageProgram(*g, ranges, s);
    for (const auto &t : p.sends) sent.insert({s, t.peer_stage, t.value});
    for (const auto &t : p.recvs) {
      received.insert({t.peer_stage, s, t.value});
      EXPECT_LT(t.peer_stage, s) << "values only flow forward";
    }
    for (ir::NodeId node : p.nodes) {
      bool own = node >= ranges[s].first && node < ranges[s].second;
      EXPECT_TRUE(own || g->nodes[node].inputs.empty()) << "only input-free ops are recomputed elsewhere";
      computed.insert(node);
    }
    loss_stages += p.computes_loss;
  }
  EXPECT_EQ(sent, received);
  EXPECT_FALSE(sent.empty());
  EXPECT_EQ(computed.size(), g->nodes.size());
  EXPECT_EQ(loss_stages, 1);
}

} // namespace
} // namespace rannc::schedule
