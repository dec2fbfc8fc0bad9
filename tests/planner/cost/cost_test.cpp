// The FLOPs table (Note [flop counts]) on hand-sized ops of both vocabularies,
// the arithmetic in each comment; whole-model figures against torchvision's
// and the 6 x parameters x tokens rule are tests/integration/flops_check.py.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "planner/cost/cost.h"
#include "planner/cost/flops.h"
#include "planner/ir/op_set.h"

namespace rannc::cost {
namespace {

using ir::Dim;
using ir::DType;

/// Builds one-op graphs: values by shape, then the op.
struct OneOp {
  ir::Graph g;
  std::vector<ir::ValueId> ins;

  ir::ValueId value(std::vector<Dim> shape, ir::ValueKind kind = ir::ValueKind::Input) {
    return g.addValue({"v" + std::to_string(g.values.size()), DType::F32, std::move(shape), true, kind});
  }
  OneOp &in(std::vector<Dim> shape) {
    ins.push_back(value(std::move(shape)));
    return *this;
  }
  OpFlops run(const std::string &op, std::vector<Dim> out, ir::AttrMap attrs = {}, int64_t b = 1) {
    ir::ValueId o = value(std::move(out), ir::ValueKind::Intermediate);
    g.addNode({"n", op, op.find("::") != std::string::npos ? std::string(ir::kAtenDomain) : "", ins, {o}, std::move(attrs)});
    return opFlops(g, g.nodes.back(), b);
  }
};

Dim F(int64_t n) { return Dim::fixed(n); }

TEST(Flops, MatrixProductsInBothVocabularies) {
  // [B,8,16] x [16,32]: 2 * (B*8*32) * 16 = 8192 at B=1, 16384 at B=2.
  for (const char *op : {"MatMul", "aten::matmul", "aten::linear"}) {
    OneOp m;
    m.in({Dim::batch(), F(8), F(16)}).in({F(16), F(32)});
    const OpFlops f = m.run(op, {Dim::batch(), F(8), F(32)}, {}, 2);
    EXPECT_EQ(f.fwd, 16384) << op;
    EXPECT_EQ(f.bwd, 2 * 16384) << op; // both input gradients
    EXPECT_EQ(f.cls, OpClass::kMatrix) << op;
  }
  // addmm(bias, [4,16], [16,32]): K from the second input; 2*4*32*16 = 4096.
  OneOp a;
  a.in({F(32)}).in({F(4), F(16)}).in({F(16), F(32)});
  EXPECT_EQ(a.run("aten::addmm", {F(4), F(32)}).fwd, 4096);
  // Gemm with transA: A is [16,4], K = 16; 2*4*32*16 = 4096.
  OneOp gemm;
  gemm.in({F(16), F(4)}).in({F(16), F(32)});
  EXPECT_EQ(gemm.run("Gemm", {F(4), F(32)}, {{"transA", int64_t{1}}}).fwd, 4096);
}

TEST(Flops, ExpertMatmulOfTransformers) {
  // grouped_mm_fallback(input [6B, 16], weight [4 experts, 16, 32], offs [4]):
  // each row meets one expert, 2 * (6B*32) * 16 = 12288 at B=2, not the 6B*32
  // of an element-wise op.
  OneOp m;
  m.in({Dim::batch(6), F(16)}).in({F(4), F(16), F(32)}).in({F(4)});
  const OpFlops f = m.run("transformers::grouped_mm_fallback", {Dim::batch(6), F(32)}, {}, 2);
  EXPECT_EQ(f.fwd, 12288);
  EXPECT_EQ(f.bwd, 2 * 12288);
  EXPECT_EQ(f.cls, OpClass::kMatrix);
}

TEST(Flops, Convolutions) {
  // ResNet's 3x3 conv, 64 -> 64 channels, 56x56 out: 2 * 64*56*56 * 64*3*3 = 231211008 per sample.
  for (const char *op : {"Conv", "aten::conv2d", "aten::_convolution"}) {
    OneOp c;
    c.in({Dim::batch(), F(64), F(56), F(56)}).in({F(64), F(64), F(3), F(3)});
    const OpFlops f = c.run(op, {Dim::batch(), F(64), F(56), F(56)}, {{"v6", int64_t{0}}});
    EXPECT_EQ(f.fwd, 231211008.0) << op;
    EXPECT_EQ(f.bwd, 2 * 231211008.0) << op;
    EXPECT_TRUE(f.convolution) << op;
  }
  // Depthwise (groups 32): weight [32,1,3,3]; 2 * 32*8*8 * 1*3*3 = 36864.
  OneOp dw;
  dw.in({F(1), F(32), F(8), F(8)}).in({F(32), F(1), F(3), F(3)});
  EXPECT_EQ(dw.run("Conv", {F(1), F(32), F(8), F(8)}, {{"group", int64_t{32}}}).fwd, 36864);
  // Transposed, 16 -> 8 channels, 2x2 stride 2 on 4x4: each input element
  // scatters into 8*2*2 outputs: 2 * (16*4*4) * (8*2*2) = 16384.
  for (auto [op, attrs] : {std::pair<const char *, ir::AttrMap>{"ConvTranspose", {}},
                           {"aten::conv_transpose2d", {}},
                           {"aten::_convolution", {{"v6", int64_t{1}}}}}) {
    OneOp t;
    t.in({F(1), F(16), F(4), F(4)}).in({F(16), F(8), F(2), F(2)});
    EXPECT_EQ(t.run(op, {F(1), F(8), F(8), F(8)}, attrs).fwd, 16384) << op;
  }
}

TEST(Flops, AttentionAndEinsum) {
  // SDPA, batch 2 x 4 heads, L = S = 16, E = Ev = 8:
  // 8 * 16*16 * (2*8 + 2*8 + 5) = 75776.
  OneOp s;
  s.in({F(2), F(4), F(16), F(8)}).in({F(2), F(4), F(16), F(8)}).in({F(2), F(4), F(16), F(8)});
  const OpFlops f = s.run("aten::scaled_dot_product_attention", {F(2), F(4), F(16), F(8)});
  EXPECT_EQ(f.fwd, 75776);
  EXPECT_EQ(f.cls, OpClass::kMatrix);
  // bhqd,bhkd->bhqk with b=2 h=4 q=k=16 d=8: 2 * 2*4*16*16*8 = 32768, in both vocabularies.
  for (auto [op, key] : {std::pair{"Einsum", "equation"}, {"aten::einsum", "v0"}}) {
    OneOp e;
    e.in({F(2), F(4), F(16), F(8)}).in({F(2), F(4), F(16), F(8)});
    EXPECT_EQ(e.run(op, {F(2), F(4), F(16), F(16)}, {{key, std::string("bhqd, bhkd -> bhqk")}}).fwd, 32768) << op;
  }
  // An ellipsis is not sized: counted as element-wise (1 per output element).
  OneOp e;
  e.in({F(2), F(3)}).in({F(3), F(4)});
  EXPECT_EQ(e.run("Einsum", {F(2), F(4)}, {{"equation", std::string("...j,jk->...k")}}).fwd, 8);
}

TEST(Flops, NormalisationsElementwiseMovementAndHost) {
  // LayerNorm over [B,8,16]: 5 per element, 640 at B=1; backward twice that.
  for (const char *op : {"LayerNormalization", "aten::layer_norm", "aten::native_layer_norm"}) {
    OneOp n;
    n.in({Dim::batch(), F(8), F(16)});
    const OpFlops f = n.run(op, {Dim::batch(), F(8), F(16)});
    EXPECT_EQ(f.fwd, 640) << op;
    EXPECT_EQ(f.bwd, 1280) << op;
  }
  // An in-place ReLU counts as ReLU: one per element.
  for (const char *op : {"Relu", "aten::relu", "aten::relu_", "aten::gelu"}) {
    OneOp r;
    r.in({F(4), F(5)});
    EXPECT_EQ(r.run(op, {F(4), F(5)}).fwd, 20) << op;
  }
  for (const char *op : {"Transpose", "aten::transpose", "aten::view", "Gather", "aten::embedding"}) {
    OneOp m;
    m.in({F(4), F(5)});
    const OpFlops f = m.run(op, {F(5), F(4)});
    EXPECT_EQ(f.fwd, 0) << op;
    EXPECT_EQ(f.cls, OpClass::kMovement) << op;
  }
  for (const char *op : {"Shape", "aten::size", "prim::ListConstruct"}) {
    OneOp h;
    h.in({F(4), F(5)});
    EXPECT_EQ(h.run(op, {F(2)}).cls, OpClass::kHost) << op;
  }
}

TEST(Flops, ConvolutionsRunAtTheTf32RateOnCuda) {
  // One conv, big enough to be compute-bound on an A100: its fp32 time is the
  // TF32 peak's ratio (156/19.5 = 8) longer than what PyTorch's default gives.
  OneOp c;
  c.in({F(64), F(256), F(56), F(56)}).in({F(256), F(256), F(3), F(3)});
  c.run("Conv", {F(64), F(256), F(56), F(56)});
  auto cluster = cluster::clusterFromPreset("a100-80g", 1);
  ASSERT_TRUE(cluster);
  cluster::DeviceSpec d = cluster->device;
  d.op_overhead_s = 0;
  const double tf32 = estimateOpCosts(c.g, d, 64)[0].fwd_time_s;
  d.peak_flops_tf32 = 0; // peakFlops falls back to fp32
  const double fp32 = estimateOpCosts(c.g, d, 64)[0].fwd_time_s;
  EXPECT_NEAR(fp32 / tf32, 156.0 / 19.5, 1e-9);
}


TEST(OpCosts, FusedElementwiseChainsAndViewsOnCuda) {
  // Note [fused element-wise chains]: x -> Mul(scale) -> Softmax -> Reshape -> MatMul.
  // On cuda the scaled scores stay inside the softmax's kernel (the Mul writes
  // nothing and launches nothing, the softmax reads nothing of them) and the
  // reshape is a view; on cpu every op moves its inputs and outputs.
  ir::Graph g;
  auto value = [&](std::vector<Dim> shape, ir::ValueKind kind) {
    return g.addValue({"v" + std::to_string(g.values.size()), DType::F32, std::move(shape), true, kind});
  };
  const ir::ValueId x = value({Dim::batch(), F(1000)}, ir::ValueKind::Input);
  const ir::ValueId scale = value({}, ir::ValueKind::Input);
  const ir::ValueId w = value({F(1000), F(10)}, ir::ValueKind::Input);
  const ir::ValueId scaled = value({Dim::batch(), F(1000)}, ir::ValueKind::Intermediate);
  const ir::ValueId probs = value({Dim::batch(), F(1000)}, ir::ValueKind::Intermediate);
  const ir::ValueId flat = value({Dim::batch(), F(1000)}, ir::ValueKind::Intermediate);
  const ir::ValueId out = value({Dim::batch(), F(10)}, ir::ValueKind::Intermediate);
  g.addNode({"mul", "Mul", "", {x, scale}, {scaled}, {}});
  g.addNode({"softmax", "Softmax", "", {scaled}, {probs}, {}});
  g.addNode({"reshape", "Reshape", "", {probs}, {flat}, {}});
  g.addNode({"matmul", "MatMul", "", {flat, w}, {out}, {}});
  auto cluster = cluster::clusterFromPreset("a100-80g", 1);
  ASSERT_TRUE(cluster);
  cluster::DeviceSpec gpu = cluster->device, cpu = gpu;
  cpu.type = "cpu";
  const int64_t b = 8, row = 8 * 1000 * 4; // bytes of one [8, 1000] fp32 tensor
  const auto on_gpu = estimateOpCosts(g, gpu, b), on_cpu = estimateOpCosts(g, cpu, b);
  EXPECT_EQ(on_cpu[0].bytes_moved, row + 4 + row);
  EXPECT_EQ(on_cpu[1].bytes_moved, row + row);
  EXPECT_EQ(on_cpu[2].bytes_moved, row + row);
  EXPECT_EQ(on_gpu[0].bytes_moved, row + 4); // reads x and the scale, writes nothing
  EXPECT_EQ(on_gpu[1].bytes_moved, row);     // writes the probabilities only
  EXPECT_EQ(on_gpu[2].bytes_moved, 0);
  EXPECT_EQ(on_gpu[3].bytes_moved, on_cpu[3].bytes_moved); // a matrix product reads what it reads
  // Launches: the Mul runs inside the softmax's kernel, the view runs nothing.
  const double bw = gpu.memory_bandwidth * gpu.memory_efficiency;
  EXPECT_DOUBLE_EQ(on_gpu[0].fwd_time_s, double(row + 4) / bw);
  EXPECT_DOUBLE_EQ(on_gpu[1].fwd_time_s, gpu.op_overhead_s + std::max(on_gpu[1].fwd_flops / (gpu.peak_flops *
                                                                                               gpu.compute_efficiency),
                                                                      double(row) / bw));
  EXPECT_EQ(on_gpu[2].fwd_time_s, 0);
  EXPECT_EQ(on_gpu[2].bwd_time_s, 0);
  EXPECT_GT(on_cpu[0].fwd_time_s, cpu.op_overhead_s);
  // What a unit keeps for backward does not depend on fusion.
  EXPECT_EQ(on_gpu[0].output_bytes, on_cpu[0].output_bytes);
}

TEST(OpCosts, TransposedMatrixOperandsOnCuda) {
  // Note [transposed operands]: x [B, 64] @ Transpose(w [10, 64]) is one GEMM
  // with a transpose flag on cuda; a transpose read by anything but matrix
  // products, or of more than two axes, still copies.
  ir::Graph g;
  auto value = [&](std::vector<Dim> shape, ir::ValueKind kind) {
    return g.addValue({"v" + std::to_string(g.values.size()), DType::F32, std::move(shape), true, kind});
  };
  const ir::ValueId x = value({Dim::batch(), F(64)}, ir::ValueKind::Input);
  const ir::ValueId w = value({F(10), F(64)}, ir::ValueKind::Input);
  const ir::ValueId wt = value({F(64), F(10)}, ir::ValueKind::Intermediate);
  const ir::ValueId out = value({Dim::batch(), F(10)}, ir::ValueKind::Intermediate);
  const ir::ValueId u = value({F(10), F(64)}, ir::ValueKind::Input);
  const ir::ValueId ut = value({F(64), F(10)}, ir::ValueKind::Intermediate);
  const ir::ValueId sum = value({F(64), F(10)}, ir::ValueKind::Intermediate);
  const ir::ValueId t3 = value({Dim::batch(), F(4), F(16)}, ir::ValueKind::Input);
  const ir::ValueId t3t = value({Dim::batch(), F(16), F(4)}, ir::ValueKind::Intermediate);
  const ir::ValueId out3 = value({Dim::batch(), F(16), F(16)}, ir::ValueKind::Intermediate);
  g.addNode({"wt", "Transpose", "", {w}, {wt}, {}});
  g.addNode({"matmul", "MatMul", "", {x, wt}, {out}, {}});
  g.addNode({"ut", "Transpose", "", {u}, {ut}, {}});
  g.addNode({"add", "Add", "", {ut, wt}, {sum}, {}}); // ut feeds an Add: a copy
  g.addNode({"t3", "Transpose", "", {t3}, {t3t}, {}}); // three axes: a copy
  g.addNode({"bmm", "MatMul", "", {t3t, t3}, {out3}, {}});
  auto cluster = cluster::clusterFromPreset("a100-80g", 1);
  ASSERT_TRUE(cluster);
  cluster::DeviceSpec gpu = cluster->device, cpu = gpu;
  cpu.type = "cpu";
  const auto on_gpu = estimateOpCosts(g, gpu, 8), on_cpu = estimateOpCosts(g, cpu, 8);
  // wt is read by the MatMul and the Add, so it copies too; only a transpose read by products alone is free.
  EXPECT_GT(on_gpu[0].bytes_moved, 0);
  g.nodes[3].inputs = {ut, ut};
  const auto freed = estimateOpCosts(g, gpu, 8);
  EXPECT_EQ(freed[0].bytes_moved, 0);
  EXPECT_EQ(freed[0].fwd_time_s, 0);
  EXPECT_EQ(freed[0].bwd_time_s, 0);
  EXPECT_GT(freed[2].bytes_moved, 0); // read by the Add
  EXPECT_GT(freed[4].bytes_moved, 0); // three axes
  EXPECT_GT(estimateOpCosts(g, cpu, 8)[0].bytes_moved, 0); // cpu keeps the copy
  EXPECT_EQ(on_cpu[1].bytes_moved, freed[1].bytes_moved);  // the product reads what it reads
}

} // namespace
} // namespace rannc::cost
