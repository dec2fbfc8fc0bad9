#include <gtest/gtest.h>

#include <cstdlib>
#include <iostream>

#include "planner/import/model_format.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {
namespace {

ir::Graph load(const std::string &model, const std::string &file = "model.onnx") {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  auto g = import::importModel(std::string(dir ? dir : "models") + "/" + model + "/" + file);
  EXPECT_TRUE(g.ok()) << g.error().message;
  return g.ok() ? *g : ir::Graph();
}

TEST(ShardingModels, Dump) {
  ir::Graph g = load(std::getenv("M") ? std::getenv("M") : "gpt");
  auto a = analyze(g);
  ASSERT_TRUE(a.ok()) << a.error().message;
  if (std::getenv("G")) g.print(std::cout);
  a->print(g, std::cout);
}

} // namespace
} // namespace rannc::sharding
