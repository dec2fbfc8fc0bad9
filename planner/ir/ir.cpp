#include "planner/ir/ir.h"

#include <sstream>

#include "planner/ir/op_set.h"

namespace rannc::ir {

namespace {
struct DTypeInfo {
  DType type;
  std::string_view name;
  int64_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::Undefined, "undef", 0}, {DType::F32, "f32", 4}, {DType::F64, "f64", 8},
    {DType::F16, "f16", 2},         {DType::BF16, "bf16", 2}, {DType::I64, "i64", 8},
    {DType::I32, "i32", 4},         {DType::I16, "i16", 2},  {DType::I8, "i8", 1},
    {DType::U8, "u8", 1},           {DType::Bool, "bool", 1}, {DType::C64, "c64", 8},
    {DType::C128, "c128", 16},
};
} // namespace

std::string_view dtypeName(DType t) {
  for (const auto &d : kDTypes)
    if (d.type == t) return d.name;
  return "undef";
}

std::optional<DType> parseDType(std::string_view name) {
  for (const auto &d : kDTypes)
    if (d.name == name) return d.type;
  return std::nullopt;
}

int64_t dtypeSize(DType t) {
  for (const auto &d : kDTypes)
    if (d.type == t) return d.size;
  return 0;
}

bool isFloating(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::F16 || t == DType::BF16;
}

int64_t numelAt(const Shape &s, int64_t b) {
  int64_t n = 1;
  for (const Dim &d : s) {
    if (!d.known) return 0;
    n *= d.at(b);
  }
  return n;
}

std::string shapeString(const Shape &s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) os << ',';
    const Dim &d = s[i];
    if (!d.known) {
      os << '?';
    } else if (d.batch_coeff == 0) {
      os << d.offset;
    } else {
      if (d.batch_coeff != 1) os << d.batch_coeff << '*';
      os << 'B';
      if (d.offset > 0) os << '+' << d.offset;
      if (d.offset < 0) os << d.offset;
    }
  }
  os << ']';
  return os.str();
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t d : dims) n *= d;
  return n;
}

std::string_view valueKindName(ValueKind k) {
  switch (k) {
  case ValueKind::Input: return "input";
  case ValueKind::Parameter: return "param";
  case ValueKind::Constant: return "const";
  case ValueKind::Intermediate: return "value";
  case ValueKind::Buffer: return "buffer";
  }
  return "value";
}

ValueId Graph::addValue(Value v) {
  auto id = static_cast<ValueId>(values.size());
  by_name_.emplace(v.name, id);
  values.push_back(std::move(v));
  return id;
}

NodeId Graph::addNode(Node n) {
  auto id = static_cast<NodeId>(nodes.size());
  for (ValueId out : n.outputs)
    if (out != kNoValue) values.at(out).producer = id;
  nodes.push_back(std::move(n));
  return id;
}

ValueId Graph::findValue(std::string_view name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? kNoValue : it->second;
}

std::vector<std::vector<NodeId>> Graph::users() const {
  std::vector<std::vector<NodeId>> u(values.size());
  for (NodeId n = 0; n < static_cast<NodeId>(nodes.size()); ++n)
    for (ValueId in : nodes[n].inputs)
      if (in != kNoValue && (u[in].empty() || u[in].back() != n)) u[in].push_back(n);
  return u;
}

std::string Graph::verify() const {
  const auto nv = static_cast<ValueId>(values.size());
  std::vector<bool> ready(values.size(), false);
  for (ValueId v = 0; v < nv; ++v)
    if (values[v].kind != ValueKind::Intermediate) ready[v] = true;
  for (NodeId n = 0; n < static_cast<NodeId>(nodes.size()); ++n) {
    const Node &node = nodes[n];
    for (ValueId in : node.inputs) {
      if (in == kNoValue) continue;
      if (in < 0 || in >= nv) return "node '" + node.name + "': input id out of range";
      if (!ready[in])
        return "node '" + node.name + "' reads '" + values[in].name +
               "' before it is produced (nodes not in topological order)";
    }
    for (ValueId out : node.outputs) {
      if (out == kNoValue) continue;
      if (out < 0 || out >= nv) return "node '" + node.name + "': output id out of range";
      if (ready[out]) return "value '" + values[out].name + "' is written twice";
      if (values[out].producer != n)
        return "value '" + values[out].name + "' has a wrong producer";
      ready[out] = true;
    }
  }
  if (loss == kNoValue) return "graph has no loss output";
  if (loss < 0 || loss >= nv || !ready[loss]) return "loss value is never produced";
  return "";
}

namespace {
template <typename T> void printList(std::ostream &os, const std::vector<T> &v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << ']';
}

void printAttr(std::ostream &os, const AttrValue &a) {
  struct Printer {
    std::ostream &os;
    void operator()(int64_t v) { os << v; }
    void operator()(double v) { os << v; }
    void operator()(const std::string &v) { os << '"' << v << '"'; }
    void operator()(const std::vector<int64_t> &v) { printList(os, v); }
    void operator()(const std::vector<double> &v) { printList(os, v); }
    void operator()(const std::vector<std::string> &v) {
      os << '[';
      for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << '"' << v[i] << '"';
      os << ']';
    }
    void operator()(const Tensor &t) {
      os << "tensor<" << dtypeName(t.dtype) << ">[";
      for (size_t i = 0; i < t.dims.size(); ++i) os << (i ? "," : "") << t.dims[i];
      os << ']';
    }
  };
  std::visit(Printer{os}, a);
}

void printValueDecl(std::ostream &os, const Value &v) {
  os << valueKindName(v.kind) << " %" << v.name << " : " << dtypeName(v.dtype)
     << (v.shape_known ? shapeString(v.shape) : std::string("[*]")) << '\n';
}
} // namespace

void Graph::print(std::ostream &os) const {
  os << "graph " << (name.empty() ? "main" : name) << " (opset " << opset << ")\n";
  for (ValueId v : inputs) printValueDecl(os, values[v]);
  for (ValueId v : parameters) printValueDecl(os, values[v]);
  for (ValueId v : constants) printValueDecl(os, values[v]);
  for (ValueId v : buffers) printValueDecl(os, values[v]);
  for (const Node &n : nodes) {
    os << "  ";
    for (size_t i = 0; i < n.outputs.size(); ++i) {
      if (i) os << ", ";
      if (n.outputs[i] == kNoValue) {
        os << "_";
        continue;
      }
      const Value &v = values[n.outputs[i]];
      os << '%' << v.name << ':' << dtypeName(v.dtype)
         << (v.shape_known ? shapeString(v.shape) : std::string("[*]"));
      if (v.batch_blocks != 1)
        os << (v.batch_blocks == 0 ? std::string("(samples mixed)")
                                   : "(samples in " + std::to_string(v.batch_blocks) + " blocks)");
    }
    os << " = " << (n.domain.empty() ? "" : n.domain + ".") << n.op_type << '(';
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (i) os << ", ";
      os << (n.inputs[i] == kNoValue ? std::string("_") : '%' + values[n.inputs[i]].name);
    }
    os << ')';
    if (!n.attrs.empty()) {
      os << " {";
      bool first = true;
      for (const auto &[k, a] : n.attrs) {
        os << (first ? "" : ", ") << k << '=';
        printAttr(os, a);
        first = false;
      }
      os << '}';
    }
    os << "  # " << n.name << '\n';
  }
  if (loss != kNoValue) os << "loss %" << values[loss].name << '\n';
}

} // namespace rannc::ir

namespace rannc::ir {

std::vector<BufferUpdate> bufferUpdates(const Graph &g) {
  std::vector<BufferUpdate> out;
  for (NodeId n = 0; n < static_cast<NodeId>(g.nodes.size()); ++n) {
    const Node &node = g.nodes[n];
    if (node.op_type != "BatchNormalization" || !node.domain.empty()) continue;
    // Inputs 3 and 4 (running mean, variance) are updated by outputs 1 and 2.
    for (size_t i = 1; i <= 2; ++i) {
      if (node.inputs.size() <= i + 2 || node.outputs.size() <= i) break;
      ValueId buffer = node.inputs[i + 2], update = node.outputs[i];
      if (buffer != kNoValue && update != kNoValue && g.values[buffer].kind == ValueKind::Buffer)
        out.push_back({n, buffer, update});
    }
  }
  return out;
}

// Note [in-place ops keep their place]
// An in-place ATen op (`zero_`, `add_`) on a computed tensor writes what
// later nodes may read through another value: torchvision's Swin V2 clones its qkv bias,
// zeroes a slice of the clone in place (aten.slice, aten.zero_) and hands
// the clone, not zero_'s output, to aten.linear. No edge orders zero_
// before that linear; the export's node order does. Such an op is never
// parameter-only, so sinkParameterOps leaves it where the export put it
// (sunk to its first reader, a zero_ that nobody reads went last, and
// Swin V2 trained with its key bias unzeroed: 0.23 off from step 1).
namespace {
/// An in-place ATen op writing a computed tensor (a view of a clone), not a
/// parameter or buffer itself (BatchNorm's `num_batches_tracked.add_(1)`
/// stays free to sink: nothing else reads the buffer in the step).
bool writesIntermediateInPlace(const Graph &g, const Node &node) {
  return isInPlace(node) && !node.inputs.empty() &&
         node.inputs[0] != kNoValue && g.values[node.inputs[0]].kind == ValueKind::Intermediate;
}
} // namespace

std::vector<bool> parameterOnlyNodes(const Graph &g) {
  const auto n = static_cast<NodeId>(g.nodes.size());
  std::vector<bool> param_side(n, false);
  for (NodeId i = 0; i < n; ++i) {
    if (writesIntermediateInPlace(g, g.nodes[i])) continue; // Note [in-place ops keep their place]
    bool only_weights = true;
    for (ValueId in : g.nodes[i].inputs) {
      if (in == kNoValue) continue;
      const Value &v = g.values[in];
      bool weight = v.kind == ValueKind::Parameter || v.kind == ValueKind::Constant || v.kind == ValueKind::Buffer ||
                    (v.kind == ValueKind::Intermediate && param_side[v.producer]);
      only_weights = only_weights && weight;
    }
    param_side[i] = only_weights;
  }
  return param_side;
}

void sinkParameterOps(Graph &g) {
  const auto n = static_cast<NodeId>(g.nodes.size());
  const std::vector<bool> param_side = parameterOnlyNodes(g);
  std::vector<NodeId> order;
  std::vector<bool> emitted(n, false);
  // Emits the not yet emitted parameter-side producers of node i, inputs first.
  std::vector<std::pair<NodeId, size_t>> stack;
  auto emitProducers = [&](NodeId root) {
    stack.push_back({root, 0});
    while (!stack.empty()) {
      auto &[node, next] = stack.back();
      const auto &inputs = g.nodes[node].inputs;
      if (next < inputs.size()) {
        ValueId in = inputs[next++];
        if (in != kNoValue && g.values[in].kind == ValueKind::Intermediate) {
          NodeId p = g.values[in].producer;
          if (param_side[p] && !emitted[p]) {
            emitted[p] = true; // claimed now, placed after its own producers
            stack.push_back({p, 0});
          }
        }
        continue;
      }
      if (node != root) order.push_back(node);
      stack.pop_back();
    }
  };
  for (NodeId i = 0; i < n; ++i) {
    if (param_side[i]) continue;
    emitProducers(i);
    order.push_back(i);
    emitted[i] = true;
  }
  for (NodeId i = 0; i < n; ++i) // parameter-side ops nobody reads
    if (!emitted[i]) {
      emitProducers(i);
      order.push_back(i);
      emitted[i] = true;
    }
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (NodeId i : order) nodes.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(nodes);
  for (NodeId i = 0; i < n; ++i)
    for (ValueId out : g.nodes[i].outputs)
      if (out != kNoValue) g.values[out].producer = i;
}

} // namespace rannc::ir
