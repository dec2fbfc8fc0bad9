// Helpers of the sharding tests on the test models (sharding_models_test,
// sharding_torch_models_test).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "planner/import/model_format.h"
#include "planner/ir/op_set.h"
#include "planner/sharding/sharding.h"

namespace rannc::sharding {

/// The path of one file of a test model.
inline std::string modelPath(const std::string &model, const std::string &file) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/" + model + "/" + file;
}

/// A test model's graph as imported (`torch`: the LibTorch front ends, for .pt and .pt2).
inline ir::Graph loadModel(const std::string &model, const std::string &file,
                           const import::TorchImporters *torch = nullptr) {
  auto g = import::importModel(modelPath(model, file), "", torch);
  EXPECT_TRUE(g.ok()) << g.error().message;
  if (!g.ok()) return ir::Graph();
  if (std::getenv("RANNC_TEST_VERBOSE")) g->print(std::cout);
  return *g;
}

struct Found {
  Analysis a;
  int column = 0, row = 0, copy = 0, sum = 0, gather = 0, embedding = 0, loss = 0;
};

inline Found found(const ir::Graph &g) {
  Found f;
  auto a = analyze(g);
  EXPECT_TRUE(a.ok()) << a.error().message;
  if (!a.ok()) return f;
  f.a = *a;
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n) {
    std::string_view role = nodeRole(g, f.a, n);
    f.column += role == "column-parallel";
    f.row += role == "row-parallel";
    f.embedding += role == "vocab-parallel embedding";
    f.loss += role == "vocab-parallel loss";
  }
  for (const Collective &c : f.a.collectives) {
    f.copy += c.kind == CollectiveKind::CopyToGroup;
    f.sum += c.kind == CollectiveKind::SumOverGroup;
    f.gather += c.kind == CollectiveKind::GatherAxis;
  }
  if (std::getenv("RANNC_TEST_VERBOSE")) f.a.print(g, std::cout);
  return f;
}

/// Every 4-D cut value (attention's [batch, heads, ...] tensors) is cut along a
/// size in `heads`; returns how many there are.
inline int headCuts(const ir::Graph &g, const Analysis &a, const std::vector<int64_t> &heads) {
  int n = 0;
  for (ir::ValueId v = 0; v < static_cast<ir::ValueId>(g.values.size()); ++v) {
    if (a.values[v].axis < 0 || g.values[v].shape.size() != 4) continue;
    const int64_t size = cutSize(g.values[v].shape[a.values[v].axis]).value_or(0);
    EXPECT_NE(std::find(heads.begin(), heads.end(), size), heads.end()) << g.values[v].name;
    ++n;
  }
  return n;
}

/// The local graph at `degree` verifies, holds 1/degree of every cut
/// parameter, and one rannc-domain node per collective and per
/// vocabulary-parallel lookup or loss.
inline void checkLocal(const ir::Graph &g, const Analysis &a, int degree) {
  auto local = localGraph(g, a, degree);
  ASSERT_TRUE(local.ok()) << local.error().message;
  EXPECT_EQ(local->verify(), "");
  if (std::getenv("RANNC_TEST_VERBOSE")) local->print(std::cout);
  for (ir::ValueId p : g.parameters) {
    const int64_t whole = ir::numelAt(g.values[p].shape, 1), here = ir::numelAt(local->values[p].shape, 1);
    EXPECT_EQ(here * (a.values[p].axis >= 0 ? degree : 1), whole) << g.values[p].name;
  }
  size_t rannc = 0, vocab = 0;
  for (const ir::Node &n : local->nodes) rannc += ir::isRannc(n);
  for (ir::NodeId n = 0; n < static_cast<ir::NodeId>(g.nodes.size()); ++n)
    vocab += nodeRole(g, a, n) == "vocab-parallel embedding" || nodeRole(g, a, n) == "vocab-parallel loss";
  EXPECT_EQ(rannc, degree == 1 ? 0 : a.collectives.size() + vocab); // degree 1 is the graph itself
}

} // namespace rannc::sharding
