// Note [autocast dtypes]: the run-time dtypes the planner gives values under
// --precision bf16|fp16, against what PyTorch 2.14's torch.autocast('cpu') does
// for the same ops (each expectation names the PyTorch behaviour it mirrors),
// the weight copies it counts, and the plan's round trip of compute_dtype.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/cost/cost.h"
#include "planner/cost/precision.h"
#include "planner/cost/profile_file.h"
#include "planner/ir/op_set.h"
#include "planner/plan/plan.h"

namespace rannc::cost {
namespace {

using ir::Dim;
using ir::DType;
using ir::ValueKind;

struct Builder {
  ir::Graph g;
  ir::ValueId value(std::vector<Dim> shape, ValueKind kind = ValueKind::Input, DType t = DType::F32) {
    return g.addValue({"v" + std::to_string(g.values.size()), t, std::move(shape), true, kind});
  }
  ir::ValueId op(const std::string &type, std::vector<ir::ValueId> ins, std::vector<Dim> out,
                 DType t = DType::F32) {
    ir::ValueId o = value(std::move(out), ValueKind::Intermediate, t);
    // As the front ends: ATen names in the ATen domain (ir::isAten).
    const std::string domain = type.find("::") != std::string::npos ? std::string(ir::kAtenDomain) : "";
    g.addNode({"n" + std::to_string(g.nodes.size()), type, domain, std::move(ins), {o}, {}});
    g.values[o].producer = ir::NodeId(g.nodes.size() - 1);
    return o;
  }
  DType at(ir::ValueId v) const { return g.values[v].runtimeDType(); }
};

Dim F(int64_t n) { return Dim::fixed(n); }

TEST(Precision, OnnxLinearLayerAndLoss) {
  Builder b;
  const ir::ValueId x = b.value({Dim::batch(), F(8)});
  const ir::ValueId w = b.value({F(8), F(16)}, ValueKind::Parameter);
  const ir::ValueId bias = b.value({F(16)}, ValueKind::Parameter);
  const ir::ValueId scale = b.value({}, ValueKind::Constant); // a 0-dim constant
  const ir::ValueId labels = b.value({Dim::batch()}, ValueKind::Input, DType::I64);
  const ir::ValueId mm = b.op("MatMul", {x, w}, {Dim::batch(), F(16)});
  const ir::ValueId add = b.op("Add", {mm, bias}, {Dim::batch(), F(16)});
  const ir::ValueId mm2 = b.op("MatMul", {add, w}, {Dim::batch(), F(16)}); // shapes aside
  const ir::ValueId div = b.op("Div", {mm2, scale}, {Dim::batch(), F(16)});
  const ir::ValueId relu = b.op("Relu", {div}, {Dim::batch(), F(16)});
  const ir::ValueId loss = b.op("SoftmaxCrossEntropyLoss", {relu, labels}, {});
  assignComputeDTypes(b.g, Precision::BF16, "cpu");
  EXPECT_EQ(b.at(mm), DType::BF16);   // matmul is on the lower-precision list
  EXPECT_EQ(b.at(add), DType::F32);   // bf16 [B,16] + fp32 [16] promotes to fp32
  EXPECT_EQ(b.at(mm2), DType::BF16);
  EXPECT_EQ(b.at(div), DType::BF16);  // a 0-dim fp32 tensor does not promote
  EXPECT_EQ(b.at(relu), DType::BF16); // unary ops keep their input's dtype
  EXPECT_EQ(b.at(loss), DType::F32);  // cross_entropy is on the fp32 list
  EXPECT_EQ(b.g.values[loss].compute_dtype, DType::Undefined); // as declared: nothing to record
  EXPECT_EQ(b.at(labels), DType::I64);
  // fp16 the same way; fp32 clears everything.
  assignComputeDTypes(b.g, Precision::FP16, "cpu");
  EXPECT_EQ(b.at(mm), DType::F16);
  assignComputeDTypes(b.g, Precision::FP32, "cpu");
  for (const ir::Value &v : b.g.values) EXPECT_EQ(v.compute_dtype, DType::Undefined) << v.name;
}

TEST(Precision, AtenOpsAndTheCudaPolicy) {
  Builder b;
  const ir::ValueId x = b.value({Dim::batch(), F(8)});
  const ir::ValueId w = b.value({F(8), F(8)}, ValueKind::Parameter);
  const ir::ValueId gamma = b.value({F(8)}, ValueKind::Parameter);
  const ir::ValueId lin = b.op("aten::linear", {x, w}, {Dim::batch(), F(8)});
  const ir::ValueId ln = b.op("aten::layer_norm", {lin, gamma}, {Dim::batch(), F(8)});
  const ir::ValueId gelu = b.op("aten::gelu", {ln}, {Dim::batch(), F(8)});
  const ir::ValueId res = b.op("aten::add", {gelu, x}, {Dim::batch(), F(8)});
  const ir::ValueId sm = b.op("aten::softmax", {lin}, {Dim::batch(), F(8)});
  assignComputeDTypes(b.g, Precision::BF16, "cpu");
  EXPECT_EQ(b.at(lin), DType::BF16);
  EXPECT_EQ(b.at(ln), DType::BF16);   // CPU: layer_norm(bf16 x, fp32 weight) is bf16
  EXPECT_EQ(b.at(gelu), DType::BF16);
  EXPECT_EQ(b.at(res), DType::F32);   // the fp32 residual promotes
  EXPECT_EQ(b.at(sm), DType::BF16);   // CPU: softmax is on no list
  assignComputeDTypes(b.g, Precision::BF16, "cuda");
  EXPECT_EQ(b.at(ln), DType::F32);    // CUDA: layer_norm and softmax are on the fp32 list
  EXPECT_EQ(b.at(sm), DType::F32);
  EXPECT_EQ(b.at(gelu), DType::F32);
}

TEST(Precision, ActivationBytesAndWeightCopies) {
  Builder b;
  const ir::ValueId x = b.value({Dim::batch(), F(32)});
  const ir::ValueId w = b.value({F(16), F(32)}, ValueKind::Parameter);
  const ir::ValueId bias = b.value({F(16)}, ValueKind::Parameter);
  const ir::ValueId gamma = b.value({F(16)}, ValueKind::Parameter);
  const ir::ValueId lin = b.op("aten::linear", {x, w, bias}, {Dim::batch(), F(16)});
  b.op("aten::layer_norm", {lin, gamma}, {Dim::batch(), F(16)});
  b.op("aten::linear", {lin, w}, {Dim::batch(), F(16)}); // the same weight again: one copy
  // The linear weight and bias are cast (16*32 + 16 elements, 2 bytes each:
  // 1056); layer_norm's gamma is not.
  EXPECT_EQ(lowPrecisionWeightBytes(b.g, 0, 3), 1056);
  EXPECT_EQ(lowPrecisionWeightBytes(b.g, 1, 2), 0);
  // Activations shrink where autocast makes them bf16: at B=4 the first
  // linear writes 4*16*2 = 128 bytes instead of 256.
  const cluster::DeviceSpec cpu;
  EXPECT_EQ(estimateOpCosts(b.g, cpu, 4)[0].output_bytes, 256);
  assignComputeDTypes(b.g, Precision::BF16, "cpu");
  EXPECT_EQ(estimateOpCosts(b.g, cpu, 4)[0].output_bytes, 128);
}

TEST(Precision, PlanRoundTripAndChecks) {
  Builder b;
  const ir::ValueId x = b.value({Dim::batch(), F(8)});
  const ir::ValueId w = b.value({F(8), F(8)}, ValueKind::Parameter);
  b.g.inputs.push_back(x);
  b.g.parameters.push_back(w);
  const ir::ValueId lin = b.op("aten::linear", {x, w}, {Dim::batch(), F(8)});
  b.g.loss = b.op("aten::sum", {lin}, {});
  assignComputeDTypes(b.g, Precision::BF16, "cpu");
  proto::Graph p = plan::graphToProto(b.g);
  EXPECT_EQ(p.ops(0).outputs(0).compute_dtype(), "bf16");
  EXPECT_EQ(p.ops(1).outputs(0).compute_dtype(), "bf16"); // sum follows its input on the CPU
  auto back = plan::graphFromProto(p);
  ASSERT_TRUE(back.ok()) << back.error().message;
  EXPECT_EQ(back->values[back->findValue(b.g.values[lin].name)].runtimeDType(), DType::BF16);
  p.mutable_ops(0)->mutable_outputs(0)->set_compute_dtype("i64");
  EXPECT_FALSE(plan::graphFromProto(p).ok());
}

TEST(Precision, ParsesOnceWithItsNames) {
  for (Precision p : {Precision::FP32, Precision::BF16, Precision::FP16}) {
    auto back = parsePrecision(precisionName(p));
    ASSERT_TRUE(back.ok()) << precisionName(p);
    EXPECT_EQ(*back, p);
  }
  EXPECT_EQ(precisionName(Precision::BF16), "bf16");
  auto bad = parsePrecision("int8");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().message, "precision must be fp32, bf16 or fp16 (got 'int8')");
  proto::Plan plan; // before the field existed: fp32
  EXPECT_EQ(*planPrecision(plan), Precision::FP32);
  plan.set_precision("fp16");
  EXPECT_EQ(*planPrecision(plan), Precision::FP16);
  plan.set_precision("FP16");
  EXPECT_FALSE(planPrecision(plan).ok());
}

TEST(Precision, ProfilesRecordTheirPrecision) {
  // A bf16 profile plans bf16 plans only; fp32 ones (written without the
  // field, as before it existed) plan fp32 plans only.
  CostTable t;
  t.units = {{0, 1}};
  t.batch_sizes = {1};
  t.costs = {{UnitCost{1e-3, 2e-3, 100, 10}}};
  const std::string path = ::testing::TempDir() + "/precision_test.profile";
  ASSERT_TRUE(writeProfile(t, {"sha", "cpu", 1, "bf16"}, path).ok());
  EXPECT_TRUE(readProfile(path, {"sha", "cpu", 1, "bf16"}).ok());
  auto fp32 = readProfile(path, {"sha", "cpu", 1, "fp32"});
  ASSERT_FALSE(fp32.ok());
  EXPECT_NE(fp32.error().message.find("measured in bf16"), std::string::npos) << fp32.error().message;
  ASSERT_TRUE(writeProfile(t, {"sha", "cpu", 1}, path).ok());
  EXPECT_TRUE(readProfile(path, {"sha", "cpu", 1}).ok());
  EXPECT_FALSE(readProfile(path, {"sha", "cpu", 1, "fp16"}).ok());
}

} // namespace
} // namespace rannc::cost
