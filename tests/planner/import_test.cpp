#include <gtest/gtest.h>

#include <onnx/onnx_pb.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "planner/import/onnx_import.h"
#include "planner/support/files.h"

namespace rannc::import {
namespace {

std::string modelPath(const std::string &name) {
  const char *dir = std::getenv("RANNC_TEST_MODELS");
  return std::string(dir ? dir : "models") + "/" + name + "/model.onnx";
}

const ir::Value &value(const ir::Graph &g, const std::string &name) {
  ir::ValueId id = g.findValue(name);
  EXPECT_NE(id, ir::kNoValue) << name;
  return g.values.at(id);
}

TEST(OnnxImport, GptInputsParametersAndLoss) {
  auto g = importModel(modelPath("gpt"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  EXPECT_EQ(g->opset, 17);
  ASSERT_EQ(g->inputs.size(), 2u);
  EXPECT_EQ(g->values[g->inputs[0]].name, "input_ids");
  EXPECT_EQ(ir::shapeString(g->values[g->inputs[0]].shape), "[B,16]");
  EXPECT_EQ(value(*g, "tok_emb.weight").kind, ir::ValueKind::Parameter);
  EXPECT_EQ(ir::shapeString(value(*g, "tok_emb.weight").shape), "[100,64]");
  EXPECT_EQ(g->parameters.size(), 38u);
  EXPECT_TRUE(g->values[g->loss].shape_known);
  EXPECT_TRUE(g->values[g->loss].shape.empty()) << "the loss is a scalar";
  EXPECT_EQ(g->verify(), "");
}

TEST(OnnxImport, BatchStaysSymbolicThroughReshapes) {
  // The logits are flattened to [B*16, 100] through a Shape->Gather->Concat
  // chain; the importer must record the size as 16*B, not the export's batch.
  auto g = importModel(modelPath("gpt"));
  ASSERT_TRUE(g.ok()) << g.error().message;
  bool found = false;
  for (const ir::Node &n : g->nodes) {
    if (n.op_type != "SoftmaxCrossEntropyLoss") continue;
    const ir::Value &logits = g->values[n.inputs[0]];
    EXPECT_EQ(ir::shapeString(logits.shape), "[16*B,100]");
    found = true;
  }
  EXPECT_TRUE(found);
  for (const ir::Node &n : g->nodes)
    if (n.op_type == "MatMul") {
      EXPECT_TRUE(g->values[n.outputs[0]].shape_known) << n.name;
    }
}

TEST(OnnxImport, OlderOpsetsImport) {
  for (const char *m : {"gpt13", "bert", "mlp"}) {
    auto g = importModel(modelPath(m));
    ASSERT_TRUE(g.ok()) << m << ": " << g.error().message;
    EXPECT_EQ(g->verify(), "") << m;
  }
}

TEST(OnnxImport, TruncatedFileIsAClearError) {
  auto bytes = readFile(modelPath("gpt"));
  ASSERT_TRUE(bytes.ok());
  auto g = importOnnxBytes(bytes->substr(0, bytes->size() / 3), "cut.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("cut.onnx"), std::string::npos) << g.error().message;
}

TEST(OnnxImport, UnsupportedOpNamesTypeNodeAndOpset) {
  onnx::ModelProto m;
  m.set_ir_version(8);
  m.add_opset_import()->set_version(15);
  auto *g = m.mutable_graph();
  auto *in = g->add_input();
  in->set_name("x");
  in->mutable_type()->mutable_tensor_type()->set_elem_type(onnx::TensorProto::FLOAT);
  auto *n = g->add_node();
  n->set_op_type("FrobnicateSparse");
  n->set_name("frob_1");
  n->add_input("x");
  n->add_output("y");
  g->add_output()->set_name("y");
  auto r = importOnnxBytes(m.SerializeAsString(), "m.onnx");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error().message, "m.onnx: unsupported op 'FrobnicateSparse' (node 'frob_1', opset 15)");
}

TEST(OnnxImport, LoadsOnlyTheNamedWeights) {
  auto w = loadModelWeights(modelPath("gpt"), {"ln_f.bias", "lm_head.weight"});
  ASSERT_TRUE(w.ok()) << w.error().message;
  ASSERT_EQ(w->size(), 2u);
  EXPECT_EQ(w->at("lm_head.weight").dims, (std::vector<int64_t>{100, 64}));
  EXPECT_EQ(w->at("lm_head.weight").data.size(), 100u * 64 * 4);
  auto missing = loadModelWeights(modelPath("gpt"), {"no.such.weight"});
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.error().message.find("no.such.weight"), std::string::npos);
}

TEST(OnnxImport, TorchScriptIsRefusedClearly) {
  auto g = importModel("model.pt");
  ASSERT_FALSE(g.ok());
  EXPECT_NE(g.error().message.find("TorchScript"), std::string::npos);
}

} // namespace
} // namespace rannc::import
