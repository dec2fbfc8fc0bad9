#include "planner/import/torchscript_import.h"

#include <torch/csrc/jit/passes/inliner.h>
#include <torch/script.h>

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <unordered_map>

#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"

namespace rannc::import {
namespace {

namespace jit = torch::jit;

// Note [torchscript lowering]
// The module's forward is inlined (method calls of submodules disappear) and
// walked in order:
//   - prim::GetAttr chains from `self` name the weights: a tensor attribute
//     that is one of the module's named_parameters() becomes a graph
//     parameter, one of its named_buffers() a buffer (BatchNorm statistics,
//     which aten::batch_norm updates in place), both named by their dotted
//     path ("blocks.0.attn.q.weight") as PyTorch's state_dict names them;
//   - prim::Constant and constant lists are folded into the ops that read
//     them as attributes; a tensor constant becomes a graph constant;
//   - a list of tensors (aten::cat's input) is folded into its reader too;
//   - every other node keeps its ATen (or prim) operator: op_type is the
//     schema name, domain "aten", attribute "overload" the overload name.
// Each operator argument i is described by attribute "t<i>": "tensor", "int",
// "float", "bool", "scalar" or "ints" for a value read from the graph (the
// next IR input; ints, floats and int lists produced at run time, such as
// aten::size's, are 0-d or 1-d tensors), "tensors" for a folded list of
// "v<i>" IR inputs, or "c:<kind>" for a constant in "v<i>" (kinds int, float,
// bool, str, device, ints, floats, bools, none). The runtime rebuilds the
// interpreter's stack from that and calls the operator (executor/runtime/
// aten_ops.cpp), so autograd, the profiler and the executor run TorchScript
// models on the same path as ONNX ones. Shapes are found by running the graph
// at batch sizes 3 and 5 and solving every dimension for a*B+c, as for ONNX.

std::string stripSuffix(const std::string &debug_name) {
  // "input_ids.1" -> "input_ids"
  const auto dot = debug_name.rfind('.');
  if (dot != std::string::npos && dot + 1 < debug_name.size() &&
      debug_name.find_first_not_of("0123456789", dot + 1) == std::string::npos)
    return debug_name.substr(0, dot);
  return debug_name;
}

/// numpy's dtype names (what make_model.py writes) in the IR's terms.
std::optional<ir::DType> numpyDType(const std::string &name) {
  static const std::map<std::string, ir::DType> kNames = {
      {"float32", ir::DType::F32}, {"float64", ir::DType::F64}, {"float16", ir::DType::F16},
      {"int64", ir::DType::I64},   {"int32", ir::DType::I32},   {"int16", ir::DType::I16},
      {"int8", ir::DType::I8},     {"uint8", ir::DType::U8},    {"bool", ir::DType::Bool}};
  auto it = kNames.find(name);
  if (it == kNames.end()) return std::nullopt;
  return it->second;
}

class Lowering {
public:
  Lowering(jit::Module module, std::string where) : module_(std::move(module)), where_(std::move(where)) {
    for (const auto &p : module_.named_parameters(true)) params_.emplace(p.name, p.value);
    for (const auto &b : module_.named_buffers(true)) buffers_.emplace(b.name, b.value);
  }

  Expected<ir::Graph> run(const nlohmann::json &inputs_desc) {
    auto graph = module_.get_method("forward").graph()->copy();
    jit::Inline(*graph);
    g_.name = where_;
    g_.opset = 17;
    // Data inputs (input 0 is the module itself).
    for (size_t i = 1; i < graph->inputs().size(); ++i) {
      const jit::Value *in = graph->inputs()[i];
      const std::string name = stripSuffix(in->debugName());
      if (!inputs_desc.contains(name))
        return Error{where_ + ": forward's input '" + name + "' is not described in " + kTorchScriptInputsFile};
      const auto &d = inputs_desc.at(name);
      auto dtype = numpyDType(d.value("dtype", std::string()));
      if (!dtype)
        return Error{where_ + ": input '" + name + "': unknown dtype '" + d.value("dtype", std::string()) + "' in " +
                     kTorchScriptInputsFile + " (use numpy's names: float32, int64, ...)"};
      ir::Value v;
      v.name = name;
      v.kind = ir::ValueKind::Input;
      v.dtype = *dtype;
      v.shape_known = true;
      v.shape.push_back(ir::Dim::batch());
      for (int64_t s : d.value("shape", std::vector<int64_t>{})) v.shape.push_back(ir::Dim::fixed(s));
      const ir::ValueId id = g_.addValue(std::move(v));
      g_.inputs.push_back(id);
      ids_[in] = id;
    }
    int index = 0;
    for (const jit::Node *n : graph->nodes())
      if (Status st = lower(n, index++); !st) return Error{st.message()};
    if (graph->outputs().size() != 1 || !ids_.count(graph->outputs()[0]))
      return Error{where_ + ": forward must return the scalar training loss (one tensor)"};
    g_.loss = ids_.at(graph->outputs()[0]);
    return std::move(g_);
  }

private:
  Status fail(const jit::Node *n, const std::string &what) const {
    return Error{where_ + ": node " + std::string(n->kind().toQualString()) + ": " + what};
  }

  ir::ValueId newValue(const jit::Value *v) {
    ir::Value iv;
    iv.name = v->debugName();
    const ir::ValueId id = g_.addValue(std::move(iv));
    ids_[v] = id;
    return id;
  }

  /// The IR value of a weight (created once per name).
  ir::ValueId weight(const std::string &name, const torch::Tensor &t, ir::ValueKind kind) {
    if (auto it = weights_.find(name); it != weights_.end()) return it->second;
    ir::Value v;
    v.name = name;
    v.kind = kind;
    v.dtype = runtime::fromScalarType(t.scalar_type());
    v.shape_known = true;
    for (int64_t s : t.sizes()) v.shape.push_back(ir::Dim::fixed(s));
    const ir::ValueId id = g_.addValue(std::move(v));
    (kind == ir::ValueKind::Parameter ? g_.parameters : g_.buffers).push_back(id);
    weights_.emplace(name, id);
    return id;
  }

  Status lower(const jit::Node *n, int index) {
    const auto kind = n->kind();
    if (kind == c10::prim::Constant) {
      const jit::Value *out = n->output();
      auto value = jit::toIValue(out);
      if (!value) return fail(n, "a constant without a value");
      if (value->isTensor()) {
        ir::Value v;
        v.name = out->debugName();
        v.kind = ir::ValueKind::Constant;
        torch::Tensor t = value->toTensor();
        v.dtype = runtime::fromScalarType(t.scalar_type());
        v.shape_known = true;
        for (int64_t s : t.sizes()) v.shape.push_back(ir::Dim::fixed(s));
        const ir::ValueId id = g_.addValue(std::move(v));
        g_.constants.push_back(id);
        g_.constant_data[id] = runtime::fromTorch(t.contiguous());
        ids_[out] = id;
      } else {
        consts_[out] = *value;
      }
      return Status::success();
    }
    if (kind == c10::prim::GetAttr) {
      const jit::Value *owner = n->input(0);
      std::string path;
      if (owner != n->owningGraph()->inputs()[0]) {
        auto it = paths_.find(owner);
        if (it == paths_.end()) return fail(n, "reads an attribute of something that is not a submodule");
        path = it->second;
      }
      const std::string full = (path.empty() ? "" : path + ".") + n->s(c10::attr::name);
      const jit::Value *out = n->output();
      if (out->type()->cast<c10::ClassType>()) {
        paths_[out] = full;
      } else if (auto p = params_.find(full); p != params_.end()) {
        ids_[out] = weight(full, p->second, ir::ValueKind::Parameter);
      } else if (auto b = buffers_.find(full); b != buffers_.end()) {
        ids_[out] = weight(full, b->second, ir::ValueKind::Buffer);
      } else {
        // A plain attribute (self.training, a stored int): its value now.
        jit::Module m = module_;
        size_t start = 0;
        while (!path.empty() && start <= path.size()) {
          size_t dot = path.find('.', start);
          m = m.attr(path.substr(start, dot - start)).toModule();
          if (dot == std::string::npos) break;
          start = dot + 1;
        }
        c10::IValue v = m.attr(n->s(c10::attr::name));
        if (v.isTensor()) return fail(n, "tensor attribute '" + full + "' is neither a parameter nor a buffer");
        consts_[out] = v;
      }
      return Status::success();
    }
    if (kind == c10::prim::ListConstruct) {
      const jit::Value *out = n->output();
      auto list_type = out->type()->cast<c10::ListType>();
      bool all_const = true;
      for (const jit::Value *in : n->inputs()) all_const = all_const && consts_.count(in);
      if (all_const && list_type && !list_type->getElementType()->cast<c10::TensorType>()) {
        c10::impl::GenericList items(list_type->getElementType());
        for (const jit::Value *in : n->inputs()) items.push_back(consts_.at(in));
        consts_[out] = c10::IValue(items);
        return Status::success();
      }
      if (list_type && list_type->getElementType()->cast<c10::TensorType>()) {
        tensor_lists_[out] = n; // folded into its reader
        return Status::success();
      }
      // A list of ints some of which are computed: its own node, an int64 vector.
    }
    if (kind == c10::prim::TupleConstruct || kind == c10::prim::TupleUnpack || kind == c10::prim::ListUnpack ||
        kind == c10::prim::If || kind == c10::prim::Loop || kind == c10::prim::CallMethod ||
        kind == c10::prim::CallFunction)
      return fail(n, "is not supported (tuples, list unpacking and control flow are not lowered yet)");
    const c10::FunctionSchema *schema = n->maybeSchema();
    if (!schema && kind != c10::prim::ListConstruct) return fail(n, "has no operator schema");

    ir::Node node;
    node.name = std::string(kind.toUnqualString()) + "_" + std::to_string(index);
    node.op_type = kind.toQualString();
    node.domain = "aten";
    node.attrs["overload"] = schema ? schema->overload_name() : std::string();
    node.attrs["nargs"] = int64_t(n->inputs().size());
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const jit::Value *in = n->input(i);
      const std::string ti = "t" + std::to_string(i), vi = "v" + std::to_string(i);
      if (auto c = consts_.find(in); c != consts_.end()) {
        if (Status st = constantArg(n, c->second, ti, vi, node.attrs); !st) return st;
      } else if (auto l = tensor_lists_.find(in); l != tensor_lists_.end()) {
        node.attrs[ti] = std::string("tensors");
        node.attrs[vi] = int64_t(l->second->inputs().size());
        for (const jit::Value *e : l->second->inputs()) {
          auto id = ids_.find(e);
          if (id == ids_.end()) return fail(n, "reads a list element that is not a tensor of the graph");
          node.inputs.push_back(id->second);
        }
      } else {
        auto id = ids_.find(in);
        if (id == ids_.end()) return fail(n, "reads '" + in->debugName() + "', which was not lowered");
        const auto &t = in->type();
        std::string tag;
        if (t->cast<c10::TensorType>()) tag = "tensor";
        else if (t->kind() == c10::TypeKind::IntType) tag = "int";
        else if (t->kind() == c10::TypeKind::FloatType) tag = "float";
        else if (t->kind() == c10::TypeKind::BoolType) tag = "bool";
        else if (t->kind() == c10::TypeKind::NumberType) tag = "scalar";
        else if (auto lt = t->cast<c10::ListType>(); lt && lt->getElementType()->kind() == c10::TypeKind::IntType)
          tag = "ints";
        else return fail(n, "argument " + std::to_string(i) + " has unsupported type " + t->str());
        node.attrs[ti] = tag;
        node.inputs.push_back(id->second);
      }
    }
    for (const jit::Value *out : n->outputs()) {
      const auto &t = out->type();
      const bool ok = t->cast<c10::TensorType>() || t->kind() == c10::TypeKind::IntType ||
                      t->kind() == c10::TypeKind::FloatType || t->kind() == c10::TypeKind::BoolType ||
                      t->kind() == c10::TypeKind::NumberType ||
                      (t->cast<c10::ListType>() &&
                       t->cast<c10::ListType>()->getElementType()->kind() == c10::TypeKind::IntType);
      if (!ok) return fail(n, "output of unsupported type " + t->str());
      node.outputs.push_back(newValue(out));
    }
    g_.addNode(std::move(node));
    return Status::success();
  }

  Status constantArg(const jit::Node *n, const c10::IValue &c, const std::string &ti, const std::string &vi,
                     ir::AttrMap &attrs) const {
    if (c.isNone()) attrs[ti] = std::string("c:none");
    else if (c.isBool()) attrs[ti] = std::string("c:bool"), attrs[vi] = int64_t(c.toBool());
    else if (c.isInt()) attrs[ti] = std::string("c:int"), attrs[vi] = c.toInt();
    else if (c.isDouble()) attrs[ti] = std::string("c:float"), attrs[vi] = c.toDouble();
    else if (c.isString()) attrs[ti] = std::string("c:str"), attrs[vi] = c.toStringRef();
    else if (c.isDevice()) attrs[ti] = std::string("c:device"), attrs[vi] = c.toDevice().str();
    else if (c.isIntList()) attrs[ti] = std::string("c:ints"), attrs[vi] = c.toIntVector();
    else if (c.isDoubleList()) attrs[ti] = std::string("c:floats"), attrs[vi] = c.toDoubleVector();
    else if (c.isBoolList()) {
      std::vector<int64_t> v;
      for (bool b : c.toBoolList()) v.push_back(b);
      attrs[ti] = std::string("c:bools"), attrs[vi] = v;
    } else {
      return fail(n, "constant argument of unsupported kind " + c.tagKind());
    }
    return Status::success();
  }

  jit::Module module_;
  std::string where_;
  ir::Graph g_;
  // Lookups by the JIT's own pointers; never iterated, so output order stays deterministic.
  std::unordered_map<const jit::Value *, ir::ValueId> ids_;
  std::unordered_map<const jit::Value *, std::string> paths_;
  std::unordered_map<const jit::Value *, c10::IValue> consts_;
  std::unordered_map<const jit::Value *, const jit::Node *> tensor_lists_;
  std::map<std::string, torch::Tensor> params_, buffers_;
  std::map<std::string, ir::ValueId> weights_;
};

/// Runs `g` without gradients at batch size `b`; every value's tensor.
std::vector<torch::Tensor> evaluate(const ir::Graph &g, const std::map<std::string, torch::Tensor> &weights,
                                    int64_t b) {
  torch::NoGradGuard no_grad;
  std::vector<torch::Tensor> env(g.values.size());
  for (ir::ValueId in : g.inputs) env[in] = runtime::syntheticInput(g.values[in], b, uint64_t(b));
  for (ir::ValueId p : g.parameters) env[p] = weights.at(g.values[p].name);
  for (ir::ValueId p : g.buffers) env[p] = weights.at(g.values[p].name).clone(); // batch_norm updates them
  for (const auto &[id, t] : g.constant_data) env[id] = runtime::toTorch(t);
  std::vector<torch::Tensor> args;
  for (const ir::Node &n : g.nodes) {
    args.clear();
    for (ir::ValueId in : n.inputs) args.push_back(in == ir::kNoValue ? torch::Tensor() : env[in]);
    std::vector<torch::Tensor> outs = runtime::runOp(n, args, g.opset);
    for (size_t i = 0; i < n.outputs.size() && i < outs.size(); ++i) env[n.outputs[i]] = outs[i];
  }
  return env;
}

} // namespace

Expected<ir::Graph> importTorchScript(const std::string &path) {
  jit::Module module;
  std::unordered_map<std::string, std::string> extra{{kTorchScriptInputsFile, ""}};
  try {
    module = jit::load(path, c10::nullopt, extra);
  } catch (const std::exception &e) {
    std::string what = e.what();
    what = what.substr(0, what.find('\n'));
    return Error{path + ": not a TorchScript archive this LibTorch (1.13) can load: " + what};
  }
  if (extra[kTorchScriptInputsFile].empty())
    return Error{path + ": the archive does not describe forward's inputs; save it with torch.jit.save(m, path, "
                        "_extra_files={'" + std::string(kTorchScriptInputsFile) +
                 "': json.dumps({name: {'dtype': 'int64', 'shape': [per-sample dims]}, ...})}) (docs/front-ends.md)"};
  nlohmann::json desc;
  try {
    desc = nlohmann::json::parse(extra[kTorchScriptInputsFile]);
  } catch (const std::exception &e) {
    return Error{path + ": " + kTorchScriptInputsFile + " is not valid JSON: " + e.what()};
  }
  std::map<std::string, torch::Tensor> weights;
  for (const auto &p : module.named_parameters(true)) weights.emplace(p.name, p.value.detach());
  for (const auto &b : module.named_buffers(true)) weights.emplace(b.name, b.value.detach());

  Lowering lowering(module, path);
  auto graph = lowering.run(desc);
  if (!graph) return graph.error();
  ir::Graph &g = *graph;

  // Shapes and dtypes: run at B = 3 and 5, solve each dimension for a*B + c.
  std::vector<torch::Tensor> at3, at5;
  try {
    at3 = evaluate(g, weights, 3);
    at5 = evaluate(g, weights, 5);
  } catch (const std::exception &e) {
    std::string what = e.what();
    return Error{path + ": running the graph to find its shapes failed: " + what.substr(0, what.find('\n'))};
  }
  for (ir::ValueId id = 0; id < ir::ValueId(g.values.size()); ++id) {
    ir::Value &v = g.values[id];
    if (v.kind != ir::ValueKind::Intermediate) continue;
    const torch::Tensor &a = at3[id], &b = at5[id];
    if (!a.defined() || !b.defined()) continue;
    v.dtype = runtime::fromScalarType(a.scalar_type());
    v.shape.clear();
    v.shape_known = a.dim() == b.dim();
    if (!v.shape_known) continue;
    for (int64_t d = 0; d < a.dim(); ++d) {
      const int64_t s3 = a.size(d), s5 = b.size(d);
      if (s3 == s5) {
        v.shape.push_back(ir::Dim::fixed(s3));
      } else if ((s5 - s3) % 2 == 0) {
        const int64_t coeff = (s5 - s3) / 2;
        v.shape.push_back(ir::Dim::batch(coeff, s3 - 3 * coeff));
      } else {
        v.shape.push_back(ir::Dim::unknown());
      }
    }
  }
  if (std::string problem = g.verify(); !problem.empty()) return Error{path + ": " + problem};
  const ir::Value &loss = g.values[g.loss];
  if (!loss.shape_known || !loss.shape.empty() || !ir::isFloating(loss.dtype))
    return Error{path + ": forward must return the scalar training loss, got " + ir::shapeString(loss.shape)};
  return std::move(g);
}

} // namespace rannc::import
