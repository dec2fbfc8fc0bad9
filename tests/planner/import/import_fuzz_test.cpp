// Importer robustness (SPEC: bad input never crashes). Real exported models
// are truncated at many lengths, have random bytes flipped and get seeded
// structural damage; every variant must import to an error that names the
// file, or to a graph that verifies. Plus the specific errors a user meets
// first: a too-new opset, an output that is not a scalar loss, nodes that do
// not match their ONNX schema.
#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "planner/import/onnx_import.h"
#include "planner/ir/op_set.h"
#include "planner/support/files.h"

namespace rannc::import {
namespace {

std::string modelPath(const std::string &name) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/" + name + "/model.onnx";
}

onnx::ModelProto loadProto(const std::string &name) {
  onnx::ModelProto m;
  auto bytes = readFile(modelPath(name));
  EXPECT_TRUE(bytes.ok()) << bytes.error().message;
  if (bytes.ok()) {
    EXPECT_TRUE(m.ParseFromString(*bytes));
  }
  return m;
}

/// Imports `bytes`: the result must be an error that starts with `where` or a
/// graph that verifies. Returns whether it imported.
bool importsCleanly(const std::string &bytes, const std::string &where) {
  auto g = importOnnxBytes(bytes, where);
  if (!g.ok()) {
    EXPECT_EQ(g.error().message.rfind(where + ": ", 0), 0u) << g.error().message;
    return false;
  }
  EXPECT_EQ(g->verify(), "") << where;
  return true;
}

class ImportFuzz : public ::testing::TestWithParam<std::string> {};

TEST_P(ImportFuzz, TruncatedFiles) {
  auto bytes = readFile(modelPath(GetParam()));
  ASSERT_TRUE(bytes.ok()) << bytes.error().message;
  std::vector<size_t> cuts;
  for (size_t n = 0; n < 64; ++n) cuts.push_back(n); // header and first fields
  for (size_t i = 1; i < 200; ++i) cuts.push_back(bytes->size() * i / 200);
  for (size_t n = 1; n <= 24; ++n) cuts.push_back(bytes->size() - n); // the trailing opset_import
  int imported = 0;
  for (size_t n : cuts) imported += importsCleanly(bytes->substr(0, n), "cut" + std::to_string(n) + ".onnx");
  // Every cut loses the opset import (the last field) or more.
  EXPECT_EQ(imported, 0);
  EXPECT_TRUE(importsCleanly(*bytes, "whole.onnx"));
}

TEST_P(ImportFuzz, FlippedBytes) {
  // Flips inside weight payloads prove nothing (the planner does not read
  // them), so the parameters' data is dropped and the flips land in the
  // graph's structure: names, ops, attributes, shapes, constants.
  onnx::ModelProto m = loadProto(GetParam());
  for (auto &t : *m.mutable_graph()->mutable_initializer())
    if (t.data_type() == onnx::TensorProto::FLOAT) t.clear_raw_data();
  std::string base = m.SerializeAsString();
  ASSERT_TRUE(importsCleanly(base, "stripped.onnx"));
  std::mt19937_64 rng(20240611);
  int imported = 0;
  for (int i = 0; i < 300; ++i) {
    std::string v = base;
    int flips = 1 + int(rng() % 4);
    for (int f = 0; f < flips; ++f) v[rng() % v.size()] ^= char(1 + rng() % 255);
    imported += importsCleanly(v, "flip" + std::to_string(i) + ".onnx");
  }
  // Some flips hit names or doc strings and leave a valid model.
  EXPECT_GT(imported, 0);
  EXPECT_LT(imported, 300);
}

/// One seeded piece of structural damage that a byte flip rarely produces:
/// ops swapped, inputs dropped or dangling, attributes of the wrong type,
/// shape constants and initializer dims with absurd values, nodes reordered.
void damage(onnx::ModelProto &m, std::mt19937_64 &rng) {
  auto *g = m.mutable_graph();
  auto pick = [&](int n) { return n > 0 ? int(rng() % uint64_t(n)) : 0; };
  auto *node = g->mutable_node(pick(g->node_size()));
  const auto &ops = ir::supportedOps();
  switch (rng() % 15) {
  case 0:
    if (node->input_size() > 0) node->mutable_input()->RemoveLast();
    break;
  case 1:
    if (node->input_size() > 0) node->set_input(pick(node->input_size()), "no_such_value");
    break;
  case 2: node->set_op_type(std::string(ops[size_t(pick(int(ops.size())))].type)); break;
  case 3:
    if (node->attribute_size() > 0) {
      auto *a = node->mutable_attribute(pick(node->attribute_size()));
      a->set_type(onnx::AttributeProto::AttributeType(1 + pick(12)));
    }
    break;
  case 4:
    if (node->attribute_size() > 0) node->mutable_attribute()->RemoveLast();
    break;
  case 5: {
    auto *a = node->add_attribute();
    a->set_name(rng() % 2 ? "axis" : "perm");
    a->set_type(onnx::AttributeProto::FLOATS);
    a->add_floats(-7.5f);
    break;
  }
  case 6: // integer constants drive shape inference's data propagation
    for (auto &t : *g->mutable_initializer()) {
      if (t.data_type() != onnx::TensorProto::INT64 || rng() % 2) continue;
      std::string raw = t.raw_data();
      for (size_t off = 0; off + 8 <= raw.size(); off += 8) {
        int64_t v = int64_t(rng() % 2000) - 1000;
        if (rng() % 5 == 0) v = std::numeric_limits<int64_t>::max() - int64_t(rng() % 3);
        raw.replace(off, 8, reinterpret_cast<const char *>(&v), 8);
      }
      t.set_raw_data(raw);
    }
    break;
  case 7:
    if (g->initializer_size() > 0) {
      auto *t = g->mutable_initializer(pick(g->initializer_size()));
      int64_t v = rng() % 2 ? -int64_t(rng() % 5) - 1 : (int64_t(1) << (30 + pick(33)));
      if (t->dims_size() > 0) t->set_dims(pick(t->dims_size()), v);
      else t->add_dims(v);
    }
    break;
  case 8:
    if (m.opset_import_size() > 0) m.mutable_opset_import(0)->set_version(int64_t(rng() % 30) - 2);
    break;
  case 9:
    if (g->input_size() > 0) {
      auto *tt = g->mutable_input(pick(g->input_size()))->mutable_type()->mutable_tensor_type();
      if (rng() % 2) tt->set_elem_type(pick(20));
      else if (tt->shape().dim_size() > 0) tt->mutable_shape()->mutable_dim(0)->set_dim_value(-5);
    }
    break;
  case 10:
    if (node->output_size() > 0 && g->node(0).output_size() > 0) node->set_output(0, g->node(0).output(0));
    break;
  case 11:
    if (g->output_size() > 0) g->mutable_output(0)->set_name(node->output_size() ? node->output(0) : "x");
    break;
  case 12:
    if (g->node_size() > 1) g->mutable_node()->SwapElements(pick(g->node_size()), pick(g->node_size()));
    break;
  case 13: node->set_domain(rng() % 2 ? "com.microsoft" : "ai.onnx"); break;
  case 14: // a Constant feeding a shape chain (Gather indices, Reshape shapes)
    for (auto &n : *g->mutable_node()) {
      if (n.op_type() != "Constant" || n.attribute_size() == 0 || rng() % 3) continue;
      auto *t = n.mutable_attribute(0)->mutable_t();
      if (t->data_type() != onnx::TensorProto::INT64) continue;
      std::string raw = t->raw_data();
      for (size_t off = 0; off + 8 <= raw.size(); off += 8) {
        int64_t v = int64_t(rng() % 40) - 20;
        raw.replace(off, 8, reinterpret_cast<const char *>(&v), 8);
      }
      if (rng() % 4 == 0 && raw.size() >= 8) { // a scalar where a 1-D list was
        raw.resize(8);
        t->clear_dims();
      }
      t->set_raw_data(raw);
    }
    break;
  }
}

TEST_P(ImportFuzz, StructuralDamage) {
  onnx::ModelProto base = loadProto(GetParam());
  for (auto &t : *base.mutable_graph()->mutable_initializer())
    if (t.data_type() == onnx::TensorProto::FLOAT) t.clear_raw_data();
  std::mt19937_64 rng(77);
  int imported = 0;
  for (int i = 0; i < 200; ++i) {
    onnx::ModelProto m = base;
    for (int k = 0, n = 1 + int(rng() % 3); k < n; ++k) damage(m, rng);
    imported += importsCleanly(m.SerializeAsString(), "damaged" + std::to_string(i) + ".onnx");
  }
  EXPECT_LT(imported, 200);
}

INSTANTIATE_TEST_SUITE_P(RealModels, ImportFuzz, ::testing::Values("gpt", "bert"));

// --- Specific errors ---------------------------------------------------------

TEST(ImportErrors, NewerOpsetIsNamed) {
  onnx::ModelProto m = loadProto("gpt");
  for (auto &os : *m.mutable_opset_import())
    if (os.domain().empty()) os.set_version(23);
  auto g = importOnnxBytes(m.SerializeAsString(), "new.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().message, "new.onnx: model uses ONNX opset 23, newer than rannc reads (up to 22); "
                               "export with opset_version=22 or lower");
}

TEST(ImportErrors, OutputThatIsNotAScalarLoss) {
  // Make the logits (the loss's input, [16*B, 100]) the graph's output.
  onnx::ModelProto m = loadProto("gpt");
  std::string logits;
  for (const auto &n : m.graph().node())
    if (n.op_type() == "SoftmaxCrossEntropyLoss") logits = n.input(0);
  ASSERT_FALSE(logits.empty());
  auto *out = m.mutable_graph()->mutable_output(0);
  out->set_name(logits);
  out->mutable_type()->mutable_tensor_type()->clear_shape();
  auto g = importOnnxBytes(m.SerializeAsString(), "logits.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error().message, "logits.onnx: graph output '" + logits +
                                   "' has shape [16*B,100], but the output must be the scalar training "
                                   "loss (as in `loss = model(input, labels)`)");
  // The inference import (the conformance runner's) takes any outputs.
  auto inf = importOnnxInference(m.SerializeAsString(), "logits.onnx");
  ASSERT_TRUE(inf.ok()) << inf.error().message;
  ASSERT_EQ(inf->outputs.size(), 1u);
  EXPECT_EQ(inf->graph.values[inf->outputs[0]].name, logits);
  EXPECT_EQ(inf->weights.count("tok_emb.weight"), 1u);

  // Two outputs: refused for training, both returned for inference.
  *m.mutable_graph()->add_output() = m.graph().output(0);
  m.mutable_graph()->mutable_output(1)->set_name(loadProto("gpt").graph().output(0).name());
  g = importOnnxBytes(m.SerializeAsString(), "two.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("exactly one output"), std::string::npos) << g.error().message;
  inf = importOnnxInference(m.SerializeAsString(), "two.onnx");
  ASSERT_TRUE(inf.ok()) << inf.error().message;
  EXPECT_EQ(inf->outputs.size(), 2u);
}

/// A one-node model: x (float [2, 3]) -> op -> y.
onnx::ModelProto tinyModel(const std::string &op, int64_t opset = 15) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(opset);
  auto *g = m.mutable_graph();
  auto *in = g->add_input();
  in->set_name("x");
  auto *tt = in->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(onnx::TensorProto::FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_value(2);
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  auto *n = g->add_node();
  n->set_op_type(op);
  n->set_name("n1");
  n->add_input("x");
  n->add_output("y");
  g->add_output()->set_name("y");
  return m;
}

std::string importError(const onnx::ModelProto &m) {
  auto g = importOnnxBytes(m.SerializeAsString(), "m.onnx");
  return g.ok() ? "" : g.error().message;
}

TEST(ImportErrors, IntegerOrShapedOutputIsNotALoss) {
  onnx::ModelProto m = tinyModel("ReduceMean"); // keepdims: [1, 1]
  EXPECT_EQ(importError(m), "m.onnx: graph output 'y' has shape [1,1], but the output must be the "
                            "scalar training loss (as in `loss = model(input, labels)`)");
  onnx::AttributeProto keep;
  keep.set_name("keepdims");
  keep.set_type(onnx::AttributeProto::INT);
  keep.set_i(0);
  *m.mutable_graph()->mutable_node(0)->add_attribute() = keep;
  EXPECT_EQ(importError(m), "");
  m = tinyModel("ArgMax");
  *m.mutable_graph()->mutable_node(0)->add_attribute() = keep;
  m.mutable_graph()
      ->mutable_input(0)
      ->mutable_type()
      ->mutable_tensor_type()
      ->mutable_shape()
      ->mutable_dim()
      ->RemoveLast();
  EXPECT_EQ(importError(m), "m.onnx: graph output 'y' is i64, but the output must be the scalar "
                            "floating-point training loss");
}

TEST(ImportErrors, NodesAreCheckedAgainstTheirSchema) {
  onnx::ModelProto m = tinyModel("MatMul");
  EXPECT_EQ(importError(m), "m.onnx: node 'n1' (MatMul) has 1 inputs, the ONNX schema (opset 13) allows 2");
  m = tinyModel("Concat");
  EXPECT_EQ(importError(m), "m.onnx: node 'n1' (Concat) lacks required attribute 'axis'");
  m = tinyModel("Transpose");
  auto *perm = m.mutable_graph()->mutable_node(0)->add_attribute();
  perm->set_name("perm");
  perm->set_type(onnx::AttributeProto::FLOATS);
  perm->add_floats(1);
  perm->add_floats(0);
  EXPECT_EQ(importError(m),
            "m.onnx: node 'n1' (Transpose) attribute 'perm' is FLOATS, the ONNX schema wants INTS");
}

TEST(ImportErrors, AbsurdInitializerDims) {
  onnx::ModelProto m = tinyModel("Reshape");
  auto *g = m.mutable_graph();
  g->mutable_node(0)->add_input("shape");
  auto *t = g->add_initializer();
  t->set_name("shape");
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(int64_t(1) << 40);
  t->add_dims(int64_t(1) << 40); // 2^80 elements: numel would overflow
  EXPECT_EQ(importError(m), "m.onnx: initializer 'shape' has a negative or implausibly large shape");
  t->set_dims(1, -3);
  EXPECT_EQ(importError(m), "m.onnx: initializer 'shape' has a negative or implausibly large shape");
}

} // namespace
} // namespace rannc::import
