#include "executor/frontend/torchscript_import.h"

#include <torch/csrc/jit/passes/dead_code_elimination.h>
#include <torch/csrc/jit/passes/inliner.h>
#include <torch/csrc/jit/passes/lower_tuples.h>
#include <torch/csrc/jit/passes/remove_mutation.h>
#include <torch/script.h>
#include <torch/version.h>

#include <nlohmann/json.hpp>

#include <map>
#include <optional>
#include <unordered_map>

#include "executor/frontend/common.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/stage.h"
#include "planner/ir/aten_args.h"
#include "executor/data/npy.h"

namespace rannc::import {
namespace {

namespace jit = torch::jit;
namespace args = ir::aten_args;

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
//   - tuples (a submodule returning (hidden, attn), `outputs[0]`) and lists
//     unpacked into tensors (`q, k, v = x.split(n, dim=2)`, chunk, unbind)
//     become plain values: an op returning Tensor[] that prim::ListUnpack
//     takes apart gets one IR output per element ("list_out" = their count);
//   - in-place ops (`x += y`, masked_fill_) become their functional forms
//     (the JIT's RemoveTensorMutation) where no alias observes the write; the
//     others (ResNet's `out += identity` before an in-place ReLU) run in place
//     on the stage's tensors, as in PyTorch, autograd checking them;
//   - every other node keeps its ATen (or prim) operator: op_type is the
//     schema name, domain "aten", attribute "overload" the overload name.
// Each operator argument is encoded in the node's attributes as Note [aten
// argument encoding] (planner/ir/aten_args.h) says. The runtime rebuilds the
// interpreter's stack from that and calls the operator (executor/runtime/
// kernels/aten.cpp), so autograd, the profiler and the executor run TorchScript
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

/// numpy's dtype names (what make_model.py writes, what np.load reads) and the IR's.
constexpr std::pair<const char *, ir::DType> kNumpyNames[] = {
    {"float32", ir::DType::F32}, {"float64", ir::DType::F64}, {"float16", ir::DType::F16},
    {"int64", ir::DType::I64},   {"int32", ir::DType::I32},   {"int16", ir::DType::I16},
    {"int8", ir::DType::I8},     {"uint8", ir::DType::U8},    {"bool", ir::DType::Bool}};

std::optional<ir::DType> numpyDType(const std::string &name) {
  for (const auto &[n, t] : kNumpyNames)
    if (name == n) return t;
  return std::nullopt;
}

std::optional<std::string> numpyName(ir::DType dtype) {
  for (const auto &[n, t] : kNumpyNames)
    if (t == dtype) return std::string(n);
  return std::nullopt;
}

class Lowering {
public:
  Lowering(jit::Module module, std::string where) : module_(std::move(module)), where_(std::move(where)) {
    // A tensor reachable under two names (nanoGPT's lm_head.weight is
    // transformer.wte.weight) is one parameter, named as PyTorch's
    // named_parameters() names it: by its first path in module order.
    for (const auto &p : module_.named_parameters(true)) {
      params_.emplace(p.name, p.value);
      canonical_.emplace(p.value.unsafeGetTensorImpl(), p.name);
    }
    for (const auto &b : module_.named_buffers(true)) {
      buffers_.emplace(b.name, b.value);
      canonical_.emplace(b.value.unsafeGetTensorImpl(), b.name);
    }
    for (const auto &m : module_.named_modules()) module_types_.emplace(m.name, m.value.type());
  }

  /// The module path of an inlined node (`model.layers.0.mlp`): each call
  /// jit::Inline recorded names the called module's attribute ("0" for a
  /// ModuleList's child), found as the nearest submodule of the caller's path
  /// with that name and the call's module type (readable plans).
  std::string modulePath(const jit::Node *n) const {
    const auto cs = n->callstack();
    if (!cs) return "";
    std::string path;
    for (const auto &frame : (*cs)->vec()) {
      const auto &info = std::get<2>(frame);
      if (!info || info->instance_name() == "SELF") continue;
      const std::string &name = info->instance_name();
      const std::string prefix = path.empty() ? "" : path + ".";
      std::string found;
      for (const auto &[p, type] : module_types_) {
        const bool under = p.rfind(prefix, 0) == 0 && p.size() > prefix.size();
        const bool named = p == prefix + name || (p.size() > name.size() + 1 &&
                                                  p.compare(p.size() - name.size() - 1, std::string::npos, "." + name) == 0);
        if (under && named && type == info->class_type() && (found.empty() || p.size() < found.size())) found = p;
      }
      path = found.empty() ? prefix + name : found;
    }
    return path;
  }

  Expected<ir::Graph> run(const nlohmann::json &inputs_desc, const std::string &inputs_source) {
    auto graph = module_.get_method("forward").graph()->copy();
    jit::Inline(*graph);
    jit::LowerSimpleTuples(graph);
    jit::RemoveTensorMutation(graph);
    jit::EliminateDeadCode(graph);
    g_.name = where_;
    g_.opset = 17;
    // Data inputs (input 0 is the module itself).
    for (size_t i = 1; i < graph->inputs().size(); ++i) {
      const jit::Value *in = graph->inputs()[i];
      const std::string name = stripSuffix(in->debugName());
      if (!inputs_desc.contains(name))
        return Error{where_ + ": forward's input '" + name + "' is not described in " + inputs_source};
      const auto &d = inputs_desc.at(name);
      auto dtype = numpyDType(d.value("dtype", std::string()));
      if (!dtype)
        return Error{where_ + ": input '" + name + "': unknown dtype '" + d.value("dtype", std::string()) + "' in " +
                     inputs_source + " (use numpy's names: float32, int64, ...)"};
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
    // The loss is forward's result, or the first element of the tuple it
    // returns (Hugging Face's `(loss, logits, ...)` with return_dict=False).
    const jit::Value *out = graph->outputs().size() == 1 ? graph->outputs()[0] : nullptr;
    if (out)
      if (auto t = tuples_.find(out); t != tuples_.end() && !t->second.empty()) out = t->second.front();
    if (!out || !ids_.count(out))
      return Error{where_ + ": forward must return the scalar training loss (a tensor, or a tuple whose first "
                            "element is the loss)"};
    g_.loss = ids_.at(out);
    return std::move(g_);
  }

private:
  Status fail(const jit::Node *n, const std::string &what) const {
    return Error{where_ + ": node " + std::string(n->kind().toQualString()) + ": " + what};
  }

  /// `v` stands for `target` (a tuple or list element taken out again).
  void alias(const jit::Value *v, const jit::Value *target) {
    if (auto id = ids_.find(target); id != ids_.end()) ids_[v] = id->second;
    if (auto c = consts_.find(target); c != consts_.end()) consts_[v] = c->second;
    if (auto t = tuples_.find(target); t != tuples_.end()) tuples_[v] = t->second;
    if (auto l = tensor_lists_.find(target); l != tensor_lists_.end()) tensor_lists_[v] = l->second;
  }

  ir::ValueId newValue(const jit::Value *v) {
    ir::Value iv;
    iv.name = v->debugName();
    const ir::ValueId id = g_.addValue(std::move(iv));
    ids_[v] = id;
    return id;
  }

  /// The IR value of a weight (created once per name).
  ir::ValueId weight(const torch::Tensor &t, ir::ValueKind kind) {
    const std::string &name = canonical_.at(t.unsafeGetTensorImpl());
    if (auto it = weights_.find(name); it != weights_.end()) return it->second;
    const ir::ValueId id = g_.addValue(tensorValue(name, t, kind));
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
        ids_[out] = weight(p->second, ir::ValueKind::Parameter);
      } else if (auto b = buffers_.find(full); b != buffers_.end()) {
        ids_[out] = weight(b->second, ir::ValueKind::Buffer);
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
      const c10::TypePtr elem = list_type ? list_type->getElementType() : nullptr;
      const bool optional_tensors = elem && elem->cast<c10::OptionalType>() &&
                                    elem->cast<c10::OptionalType>()->getElementType()->cast<c10::TensorType>();
      if (elem && (elem->cast<c10::TensorType>() || optional_tensors)) {
        tensor_lists_[out] = n; // folded into its reader (Tensor?[]: aten::index's indices)
        return Status::success();
      }
      // A list of ints some of which are computed: its own node, an int64 vector.
    }
    if (kind == c10::prim::TupleConstruct) {
      tuples_[n->output()] = std::vector<const jit::Value *>(n->inputs().begin(), n->inputs().end());
      return Status::success();
    }
    if (kind == c10::prim::TupleUnpack || kind == c10::prim::TupleIndex) {
      auto t = tuples_.find(n->input(0));
      if (t == tuples_.end()) return fail(n, "takes apart a tuple that was not built in the graph");
      if (kind == c10::prim::TupleUnpack) {
        if (t->second.size() != n->outputs().size()) return fail(n, "unpacks a tuple of another size");
        for (size_t i = 0; i < n->outputs().size(); ++i) alias(n->output(i), t->second[i]);
        return Status::success();
      }
      auto index = consts_.find(n->input(1));
      if (index == consts_.end() || !index->second.isInt()) return fail(n, "indexes a tuple with a computed index");
      int64_t i = index->second.toInt();
      if (i < 0) i += int64_t(t->second.size());
      if (i < 0 || i >= int64_t(t->second.size())) return fail(n, "indexes past the end of a tuple");
      alias(n->output(), t->second[size_t(i)]);
      return Status::success();
    }
    if (kind == c10::prim::ListUnpack) {
      if (auto l = tensor_lists_.find(n->input(0)); l != tensor_lists_.end()) {
        if (l->second->inputs().size() != n->outputs().size()) return fail(n, "unpacks a list of another size");
        for (size_t i = 0; i < n->outputs().size(); ++i) alias(n->output(i), l->second->input(i));
        return Status::success();
      }
      // The outputs of an op's Tensor[] result were made with that op.
      for (const jit::Value *o : n->outputs())
        if (!ids_.count(o)) return fail(n, "unpacks a list that is not a tensor list of the graph");
      return Status::success();
    }
    if (kind == c10::prim::If || kind == c10::prim::Loop || kind == c10::prim::CallMethod ||
        kind == c10::prim::CallFunction)
      return fail(n, "is not supported (control flow and calls are not lowered; trace the model with "
                     "torch.jit.trace, or export it with torch.export)");

    const c10::FunctionSchema *schema = n->maybeSchema();
    if (!schema && kind != c10::prim::ListConstruct) return fail(n, "has no operator schema");

    ir::Node node;
    const std::string path = modulePath(n); // readable plans, as ONNX exporters name nodes
    node.name = (path.empty() ? "" : path + "/") + kind.toUnqualString() + "_" + std::to_string(index);
    node.op_type = kind.toQualString();
    node.domain = "aten";
    node.attrs[args::kOverload] = schema ? schema->overload_name() : std::string();
    node.attrs[args::kNargs] = int64_t(n->inputs().size());
    for (size_t i = 0; i < n->inputs().size(); ++i) {
      const jit::Value *in = n->input(i);
      const std::string ti = args::kindKey(i), vi = args::valueKey(i);
      if (auto c = consts_.find(in); c != consts_.end()) {
        if (Status st = constantArg(n, c->second, ti, vi, node.attrs); !st) return st;
      } else if (auto l = tensor_lists_.find(in); l != tensor_lists_.end()) {
        // Tensor[]: "tensors"; Tensor?[]: "opt_tensors" with "m<i>" marking
        // which elements are tensors (the others None).
        const bool optional = l->second->output()->type()->cast<c10::ListType>()->getElementType()->cast<c10::OptionalType>() != nullptr;
        node.attrs[ti] = (optional ? args::kOptTensors : args::kTensors);
        node.attrs[vi] = int64_t(l->second->inputs().size());
        std::vector<int64_t> mask;
        for (const jit::Value *e : l->second->inputs()) {
          if (auto c = consts_.find(e); optional && c != consts_.end() && c->second.isNone()) {
            mask.push_back(0);
            continue;
          }
          auto id = ids_.find(e);
          if (id == ids_.end()) return fail(n, "reads a list element that is not a tensor of the graph");
          node.inputs.push_back(id->second);
          mask.push_back(1);
        }
        if (optional) node.attrs[args::maskKey(i)] = mask;
      } else {
        auto id = ids_.find(in);
        if (id == ids_.end()) return fail(n, "reads '" + in->debugName() + "', which was not lowered");
        const auto &t = in->type();
        std::string tag;
        if (t->cast<c10::TensorType>()) tag = args::kTensor;
        else if (t->kind() == c10::TypeKind::IntType) tag = args::kInt;
        else if (t->kind() == c10::TypeKind::FloatType) tag = args::kFloat;
        else if (t->kind() == c10::TypeKind::BoolType) tag = args::kBool;
        else if (t->kind() == c10::TypeKind::NumberType) tag = args::kScalar;
        else if (auto lt = t->cast<c10::ListType>(); lt && lt->getElementType()->kind() == c10::TypeKind::IntType)
          tag = args::kInts;
        else return fail(n, "argument " + std::to_string(i) + " has unsupported type " + t->str());
        node.attrs[ti] = tag;
        node.inputs.push_back(id->second);
      }
    }
    // A Tensor[] result that prim::ListUnpack takes apart: one output per element.
    if (n->outputs().size() == 1) {
      const jit::Value *out = n->output();
      auto lt = out->type()->cast<c10::ListType>();
      if (lt && lt->getElementType()->cast<c10::TensorType>()) {
        const auto &uses = out->uses();
        if (uses.size() != 1 || uses[0].user->kind() != c10::prim::ListUnpack)
          return fail(n, "returns a tensor list that is not unpacked into tensors (rannc lowers `a, b = "
                         "x.split(...)`, not a list kept whole)");
        const jit::Node *unpack = uses[0].user;
        node.attrs[args::kListOut] = int64_t(unpack->outputs().size());
        for (const jit::Value *o : unpack->outputs()) node.outputs.push_back(newValue(o));
        g_.addNode(std::move(node));
        return Status::success();
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
    if (c.isNone()) attrs[ti] = args::kConstNone;
    else if (c.isBool()) attrs[ti] = args::kConstBool, attrs[vi] = int64_t(c.toBool());
    else if (c.isInt()) attrs[ti] = args::kConstInt, attrs[vi] = c.toInt();
    else if (c.isDouble()) attrs[ti] = args::kConstFloat, attrs[vi] = c.toDouble();
    else if (c.isString()) attrs[ti] = args::kConstStr, attrs[vi] = c.toStringRef();
    else if (c.isDevice()) attrs[ti] = args::kConstDevice, attrs[vi] = c.toDevice().str();
    else if (c.isIntList()) attrs[ti] = args::kConstInts, attrs[vi] = c.toIntVector();
    else if (c.isDoubleList()) attrs[ti] = args::kConstFloats, attrs[vi] = c.toDoubleVector();
    else if (c.isBoolList()) {
      std::vector<int64_t> v;
      for (bool b : c.toBoolList()) v.push_back(b);
      attrs[ti] = args::kConstBools, attrs[vi] = v;
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
  std::unordered_map<const jit::Value *, std::vector<const jit::Value *>> tuples_;
  std::map<std::string, torch::Tensor> params_, buffers_;
  std::map<std::string, ir::ValueId> weights_;
  std::map<std::string, c10::ClassTypePtr> module_types_; // submodules by path
  std::unordered_map<const c10::TensorImpl *, std::string> canonical_; // lookups only
};

/// The inputs of forward described by DIR/<input>.npy (dtype, per-sample shape),
/// in the archive description's JSON form.
Expected<nlohmann::json> describeFromData(const jit::Module &module, const std::string &dir) {
  nlohmann::json desc = nlohmann::json::object();
  auto graph = module.get_method("forward").graph();
  for (size_t i = 1; i < graph->inputs().size(); ++i) {
    const std::string name = stripSuffix(graph->inputs()[i]->debugName());
    const std::string file = dir + "/" + name + ".npy";
    auto a = data::NpyArray::open(file);
    if (!a) return Error{"--data " + dir + ": forward's input '" + name + "': " + a.error().message};
    auto np = numpyName(a->dtype());
    if (!np) return Error{file + ": element type " + std::string(ir::dtypeName(a->dtype())) + " is not a model input type"};
    std::vector<int64_t> shape(a->shape().begin() + (a->shape().empty() ? 0 : 1), a->shape().end());
    desc[name] = {{"dtype", *np}, {"shape", shape}};
  }
  return desc;
}

} // namespace

Expected<ir::Graph> importTorchScript(const std::string &path, const std::string &data_dir) {
  jit::Module module;
  std::unordered_map<std::string, std::string> extra{{kTorchScriptInputsFile, ""}};
  try {
    module = jit::load(path, c10::nullopt, extra);
  } catch (const std::exception &e) {
    return Error{path + ": not a TorchScript archive this LibTorch (" + std::string(TORCH_VERSION) +
                 ") can load: " + firstLine(e.what())};
  }
  nlohmann::json desc;
  std::string source = kTorchScriptInputsFile;
  if (!data_dir.empty()) {
    auto d = describeFromData(module, data_dir);
    if (!d) return d.error();
    desc = std::move(*d);
    source = "--data " + data_dir;
  } else if (extra[kTorchScriptInputsFile].empty()) {
    return Error{path + ": the archive does not describe forward's inputs; pass --data DIR (the training data, "
                        "one <input>.npy each), or save it with torch.jit.save(m, path, _extra_files={'" +
                 std::string(kTorchScriptInputsFile) +
                 "': json.dumps({name: {'dtype': 'int64', 'shape': [per-sample dims]}, ...})}) (docs/front-ends.md)"};
  } else {
    try {
      desc = nlohmann::json::parse(extra[kTorchScriptInputsFile]);
    } catch (const std::exception &e) {
      return Error{path + ": " + kTorchScriptInputsFile + " is not valid JSON: " + e.what()};
    }
  }
  std::map<std::string, torch::Tensor> weights;
  for (const auto &p : module.named_parameters(true)) weights.emplace(p.name, p.value.detach());
  for (const auto &b : module.named_buffers(true)) weights.emplace(b.name, b.value.detach());

  Lowering lowering(module, path);
  auto graph = lowering.run(desc, source);
  if (!graph) return graph.error();
  ir::Graph &g = *graph;

  if (Status st = findShapesByRunning(g, weights, path); !st) return Error{st.message()};
  return std::move(g);
}

} // namespace rannc::import
