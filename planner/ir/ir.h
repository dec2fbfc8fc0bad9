// The graph IR: a torch-free, front-end-neutral description of a training graph.
//
// Note [symbolic batch]
// Every dimension is an affine function of the global (or micro-) batch size B:
// size = batch_coeff * B + offset. A plain fixed dimension has batch_coeff == 0.
// Shapes are recorded this way at import so one graph (and one plan) describes
// the model at any micro-batch or shard size; the executor never relies on them
// for correctness (LibTorch computes real shapes), only the planner's cost and
// memory estimates and the receive-buffer checks do.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace rannc::ir {

/// Element types, named as ONNX names them. C64 and C128 (complex, two
/// float32 or float64) only come from torch.export graphs, where a rotary
/// embedding computed with torch.polar and view_as_complex holds them
/// between ops; they are never parameters, and like integer values they
/// never cross stages: the consuming stage rebuilds them from the float
/// values they derive from (Note [recomputed values] in
/// executor/schedule/schedule.cpp), whose gradients go back. New types go at
/// the end: the executor's tensor headers carry the number.
enum class DType : uint8_t { Undefined, F32, F64, F16, BF16, I64, I32, I16, I8, U8, Bool, C64, C128 };

/// Short lowercase name ("f32", "i64", "bool", ...).
std::string_view dtypeName(DType t);
/// Inverse of dtypeName; nullopt for an unknown name.
std::optional<DType> parseDType(std::string_view name);
/// Bytes per element (Bool counts as 1).
int64_t dtypeSize(DType t);
/// True for the floating-point types (the ones that carry gradients).
bool isFloating(DType t);

/// One dimension, affine in the batch size (see Note [symbolic batch]).
struct Dim {
  int64_t batch_coeff = 0;
  int64_t offset = 0;
  bool known = true;

  static Dim fixed(int64_t n) { return Dim{0, n, true}; }
  static Dim batch(int64_t coeff = 1, int64_t offset = 0) { return Dim{coeff, offset, true}; }
  static Dim unknown() { return Dim{0, 0, false}; }
  bool isFixed() const { return known && batch_coeff == 0; }
  /// The concrete size at batch size b (0 when unknown).
  int64_t at(int64_t b) const { return known ? batch_coeff * b + offset : 0; }
  bool operator==(const Dim &o) const {
    return known == o.known && batch_coeff == o.batch_coeff && offset == o.offset;
  }
};
using Shape = std::vector<Dim>;

/// Number of elements of a shape at batch size b (0 if any dim is unknown).
int64_t numelAt(const Shape &s, int64_t b);
/// "[B,128,4*B+1,?]"
std::string shapeString(const Shape &s);

/// A dense tensor with raw little-endian contents (constants and weights).
struct Tensor {
  DType dtype = DType::Undefined;
  std::vector<int64_t> dims;
  std::string data; ///< raw bytes, numel() * dtypeSize(dtype) of them

  int64_t numel() const;
};

/// An operator attribute, as ONNX defines them.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>,
                               std::vector<double>, std::vector<std::string>, Tensor>;
/// Attributes by name; std::map so printing order is deterministic.
using AttrMap = std::map<std::string, AttrValue>;

/// Where a value comes from.
enum class ValueKind : uint8_t {
  Input,        ///< batch data fed per step (first dimension = samples)
  Parameter,    ///< trainable weight, loaded from the model file
  Constant,     ///< non-trainable tensor known before training
  Intermediate, ///< produced by a node
  Buffer,       ///< non-trained state loaded from the model file, updated by forward (Note [buffers])
};
std::string_view valueKindName(ValueKind k);

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;

struct Value {
  std::string name;
  DType dtype = DType::Undefined;
  Shape shape;
  bool shape_known = false; ///< false when even the rank is unknown
  ValueKind kind = ValueKind::Intermediate;
  NodeId producer = -1;     ///< the node that writes it (Intermediate only)
  /// How the samples lie along the batch axis (the first dimension affine in
  /// B, of size c*B): as [batch_blocks, B, c/batch_blocks] in row-major order.
  /// 1: each sample's c rows are contiguous ([B*T, C] from a batch-first
  /// reshape); T: interleaved ([T*B, C] from sequence-first attention); 0:
  /// unknown (samples mixed, as after BatchNorm). Note [batch layout].
  int64_t batch_blocks = 1;
  /// The dtype at run time under a mixed-precision plan (autocast casts it;
  /// Note [autocast dtypes] in planner/cost/precision.cpp); Undefined: `dtype`.
  DType compute_dtype = DType::Undefined;
  /// The dtype the value has at run time.
  DType runtimeDType() const { return compute_dtype == DType::Undefined ? dtype : compute_dtype; }
};

struct Node {
  std::string name;
  std::string op_type;      ///< e.g. "MatMul"
  std::string domain;       ///< "" for the default ONNX domain
  std::vector<ValueId> inputs;  ///< kNoValue marks an omitted optional input
  std::vector<ValueId> outputs; ///< kNoValue marks an omitted optional output
  AttrMap attrs;
};

/// A training graph: nodes in topological order, the loss as its only output.
class Graph {
public:
  std::vector<Value> values;
  std::vector<Node> nodes;   ///< topological order
  std::vector<ValueId> inputs;     ///< batch data, in model order
  std::vector<ValueId> parameters; ///< trainable weights, in model order
  std::vector<ValueId> constants;  ///< initializers that are not trained
  std::vector<ValueId> buffers;    ///< BatchNorm running statistics, in model order (Note [buffers])
  ValueId loss = kNoValue;         ///< the scalar training loss
  int64_t opset = 0;               ///< default-domain opset version
  std::string name;
  /// Inline contents of Constant values (weights stay in the model file).
  std::map<ValueId, Tensor> constant_data;
  /// Files next to the model that hold its weights (ONNX external data,
  /// relative to the model's folder), sorted, each once; present or not.
  std::vector<std::string> external_data;

  /// Adds a value and returns its id.
  ValueId addValue(Value v);
  /// Adds a node (after all its inputs' producers), sets producer of outputs.
  NodeId addNode(Node n);
  /// Id of the value with this name, or kNoValue.
  ValueId findValue(std::string_view name) const;
  /// For each value, the nodes that read it, in node order.
  std::vector<std::vector<NodeId>> users() const;
  /// Checks the invariants (ids in range, topological order, one producer per
  /// value, loss set); returns an empty string when valid, else the problem.
  std::string verify() const;
  /// Text dump, one line per value declaration and per node.
  void print(std::ostream &os) const;

private:
  std::map<std::string, ValueId, std::less<>> by_name_;
};

} // namespace rannc::ir

namespace rannc::ir {

/// Note [buffers]
/// A buffer is model state that is loaded from the model file like a weight
/// but never trained: no gradient, no optimizer state, no all-reduce. Today
/// the only buffers are BatchNormalization's running mean and variance: the
/// importer makes a floating-point initializer a buffer when every node that
/// reads it is a BatchNormalization reading it as input 3 (mean) or 4
/// (variance); every other floating-point initializer is a parameter. In
/// training mode BatchNormalization's optional outputs 1 and 2 are the updated
/// running statistics (ONNX semantics; torch.onnx.export emits them at every
/// opset: 5 outputs up to opset 13, 3 from opset 14). After each micro-batch's
/// forward, the stage that ran the node copies them into the buffers
/// (bufferUpdates lists the pairs), so the statistics persist across
/// micro-batches and steps as in PyTorch. Replicas of a stage each update
/// their own copy from their own samples (as DDP with broadcast_buffers=False).
/// The planner counts buffers as buffer memory, not as parameters.

/// One running statistic written back after forward: `update` (an output of
/// `node`) becomes the new contents of `buffer` (an input of it).
struct BufferUpdate {
  NodeId node;
  ValueId buffer;
  ValueId update;
};

/// Every buffer update of the graph, in node order (Note [buffers]).
std::vector<BufferUpdate> bufferUpdates(const Graph &g);

/// For each node: true when it reads only parameters, buffers, constants and
/// the outputs of other such nodes (a weight's Transpose, a Constant).
std::vector<bool> parameterOnlyNodes(const Graph &g);

/// Reorders nodes (keeping a topological order) so that every op computed
/// from parameters and constants alone — a weight's Transpose, a Constant —
/// comes right before its first consumer. Exporters tend to emit such ops
/// early; left there, a contiguous stage split would put a weight's
/// transpose in one stage and its MatMul in the next, shipping the weight and
/// its gradient between stages every micro-batch.
void sinkParameterOps(Graph &g);

} // namespace rannc::ir
