#include "executor/frontend/torch_export_import.h"

#include <torch/csrc/jit/runtime/operator.h>

#include <limits>
#include <map>
#include <set>

#include "executor/frontend/common.h"
#include "executor/runtime/ops.h"
#include "executor/runtime/pt2_archive.h"
#include "planner/ir/aten_args.h"

namespace rannc::import {
namespace {

using nlohmann::json;
namespace args = ir::aten_args;

// Note [torch.export lowering]
// A `.pt2` archive holds the ExportedProgram as JSON (torch/_export/serde):
// a flat graph of ATen calls ("torch.ops.aten.linear.default") whose inputs
// are the lifted parameters, buffers and constants, then the user inputs
// (input_specs say which), with every argument serialized by name and kind
// (as_tensor, as_int, as_sym_ints, ...). Each call becomes an IR node in the
// encoding the TorchScript front end uses (Note [aten argument encoding]):
// op_type "aten::linear", attribute "overload", and per schema argument
// "t<i>"/"v<i>", the arguments the serializer left out filled from the
// operator's schema defaults. So the runtime runs both formats through one path, LibTorch's
// operator registry, with autograd. Symbolic sizes (aten.sym_size.int, the
// batch) are IR values like aten::size's; a list mixing them with constants
// becomes a prim::ListConstruct node. Parameters stored once under two names
// (tied weights) are one parameter named by the first, as named_parameters()
// does. The graph signature alone says what trains: parameters train,
// buffers (any dtype, persistent or not: a rotary inv_freq) never do, lifted
// constants are constants. Ops are named by their module path from the
// nn_module_stack metadata (readable plans). Shapes are found by running the graph, as for TorchScript; the input
// description comes from the program's signature (dim 0 symbolic, the batch).
//
// Note [non-finite floats]: torch/_export/serde writes its JSON with
// allow_nan=False, so a float argument that is infinite or NaN (the -inf a
// causal mask is filled with) is the string "Infinity", "-Infinity" or "NaN".
double exportFloat(const json &v) {
  if (!v.is_string()) return v.get<double>();
  const std::string s = v.get<std::string>();
  if (s == "Infinity") return std::numeric_limits<double>::infinity();
  if (s == "-Infinity") return -std::numeric_limits<double>::infinity();
  if (s == "NaN") return std::numeric_limits<double>::quiet_NaN();
  return v.get<double>(); // any other string: nlohmann's own type error
}

std::vector<double> exportFloats(const json &v) {
  std::vector<double> out;
  for (const json &e : v) out.push_back(exportFloat(e));
  return out;
}

// Note [symbolic sequence]
// Hugging Face exports a token model with the batch and the sequence dynamic,
// and so do users following its docs. rannc's shapes are affine in the batch
// alone (Note [symbolic batch]), so a symbolic dimension past the first takes
// the size of the example the program was exported with (its `hint`) for
// planning; the ops read the sequence length through aten.sym_size, so
// LibTorch runs the graph at the data's length. The audit warns of it.

/// "torch.ops.aten.linear.default" -> ("aten::linear", ""); sym-int Python
/// operators (shape arithmetic and comparisons, torch.sym_max / sym_min) to
/// their int forms in LibTorch's operator registry (aten::, prim::); the
/// library custom ops rannc registers (Note [library custom ops]) under
/// their own namespace, "transformers::grouped_mm_fallback".
std::optional<std::pair<std::string, std::string>> operatorName(const std::string &target) {
  static const std::map<std::string, std::pair<std::string, std::string>> kPython = {
      {"_operator.add", {"aten::add", "int"}},           {"_operator.sub", {"aten::sub", "int"}},
      {"_operator.mul", {"aten::mul", "int"}},           {"_operator.floordiv", {"aten::floordiv", "int"}},
      {"_operator.mod", {"aten::remainder", "int"}},     {"_operator.neg", {"aten::neg", "int"}},
      {"_operator.eq", {"aten::eq", "int"}},             {"_operator.ne", {"aten::ne", "int"}},
      {"_operator.lt", {"aten::lt", "int"}},             {"_operator.le", {"aten::le", "int"}},
      {"_operator.gt", {"aten::gt", "int"}},             {"_operator.ge", {"aten::ge", "int"}},
      {"torch.sym_max", {"prim::max", "int"}},           {"torch.sym_min", {"prim::min", "int"}},
      {"torch.ops.aten.sym_size.int", {"aten::size", "int"}},
      {"torch.ops.aten.sym_numel.default", {"aten::numel", ""}}};
  if (auto it = kPython.find(target); it != kPython.end()) return it->second;
  for (const std::string ns : {"aten", "transformers"}) {
    const std::string prefix = "torch.ops." + ns + ".";
    if (target.rfind(prefix, 0) != 0) continue;
    const std::string rest = target.substr(prefix.size());
    const auto dot = rest.rfind('.');
    if (dot == std::string::npos) return std::nullopt;
    std::string overload = rest.substr(dot + 1);
    if (overload == "default") overload.clear();
    return std::make_pair(ns + "::" + rest.substr(0, dot), overload);
  }
  return std::nullopt;
}

/// Runtime checks the exporter inserts; they compute nothing the loss needs.
bool isAssertion(const std::string &target) {
  return target == "torch.ops.aten._assert_scalar.default" || target == "torch.ops.aten._assert_tensor_metadata.default" ||
         target == "torch.ops.aten.sym_constrain_range_for_size.default" ||
         target == "torch.ops.aten.sym_constrain_range.default" || target == "torch.ops.aten._assert_async.msg";
}

/// torch.export's serialized MemoryFormat (schema.py) as c10's enum value.
int64_t memoryFormatToC10(int64_t code) {
  switch (code) {
  case 2: return int64_t(c10::MemoryFormat::ChannelsLast);
  case 3: return int64_t(c10::MemoryFormat::ChannelsLast3d);
  case 4: return int64_t(c10::MemoryFormat::Preserve);
  default: return int64_t(c10::MemoryFormat::Contiguous);
  }
}

class Lowering {
public:
  Lowering(const json &program, const runtime::Pt2Archive &archive, std::string where, ImportAudit *audit)
      : program_(program), archive_(archive), where_(std::move(where)), audit_(audit) {}

  Expected<ir::Graph> run() {
    const json &gm = program_.at("graph_module");
    const json &graph = gm.at("graph");
    const json &sig = gm.at("signature");
    tensor_meta_ = graph.at("tensor_values");
    g_.name = where_;
    g_.opset = 17;
    if (Status st = lowerInputs(sig); !st) return Error{st.message()};
    // Buffers a functionalized program writes back (Note [buffer mutations]).
    for (const json &spec : sig.at("output_specs"))
      if (spec.begin().key() == "buffer_mutation") {
        const json &body = spec.begin().value(); // arg: a TensorArgument, {"name": ...}
        const json &arg = body.at("arg").contains("as_tensor") ? body.at("arg").at("as_tensor") : body.at("arg");
        mutations_[arg.at("name").get<std::string>()] = body.at("buffer_name").get<std::string>();
      }
    for (const json &n : graph.at("nodes"))
      if (Status st = lowerNode(n); !st) return Error{st.message()};
    // The loss: the one user (or loss) output.
    std::string loss;
    for (const json &spec : sig.at("output_specs")) {
      const std::string kind = spec.begin().key();
      if (kind == "buffer_mutation") continue;
      if (kind != "user_output" && kind != "loss_output")
        return Error{refuse("written-back input", "the program has a " + kind + " output (an input or gradient "
                                                  "written back), which rannc does not lower; forward must return "
                                                  "only the scalar training loss").message()};
      const json &arg = spec.begin().value().at("arg");
      if (!arg.contains("as_tensor")) return Error{where_ + ": an output that is not a tensor"};
      if (!loss.empty()) return Error{where_ + ": forward must return only the scalar training loss"};
      loss = arg.at("as_tensor").at("name").get<std::string>();
    }
    auto id = values_.find(loss);
    if (loss.empty() || id == values_.end()) return Error{where_ + ": the program returns no loss tensor"};
    g_.loss = id->second;
    return std::move(g_);
  }

  /// The weights by the IR's (canonical) names.
  std::map<std::string, torch::Tensor> weights() const {
    std::map<std::string, torch::Tensor> w;
    for (const auto &[name, id] : weight_ids_) w.emplace(name, archive_.tensors.at(name));
    return w;
  }

private:
  Status fail(const std::string &what) const { return Error{where_ + ": " + what}; }

  /// Records a finding in the audit, when there is one (Note [import audit]).
  void note(AuditAction action, const std::string &kind, const std::string &reason,
            std::vector<std::string> names = {}) {
    if (audit_) audit_->add(action, kind, reason, std::move(names));
  }
  /// Records a refusal and returns it as the import's error.
  Status refuse(const std::string &kind, const std::string &what) {
    note(AuditAction::Refused, kind, what);
    return fail(what);
  }

  Expected<ir::DType> metaDType(const std::string &name) const {
    if (!tensor_meta_.contains(name)) return Error{where_ + ": no tensor description for '" + name + "'"};
    auto st = runtime::scalarTypeFromExport(tensor_meta_.at(name).at("dtype").get<int64_t>());
    if (!st) return Error{where_ + ": '" + name + "': " + st.error().message};
    return runtime::fromScalarType(*st);
  }

  Status lowerInputs(const json &sig) {
    // Tied weights: the first name of each stored tensor is the parameter's.
    std::map<std::string, std::string> canonical_of_storage;
    for (const json &spec : sig.at("input_specs")) {
      const std::string kind = spec.begin().key();
      const json &body = spec.begin().value();
      if (kind == "user_input") {
        const json &arg = body.at("arg");
        if (!arg.contains("as_tensor")) return fail("a non-tensor user input, which rannc does not take");
        const std::string name = arg.at("as_tensor").at("name").get<std::string>();
        auto dtype = metaDType(name);
        if (!dtype) return Status(dtype.error());
        ir::Value v;
        v.name = uniqueName(name);
        v.kind = ir::ValueKind::Input;
        v.dtype = *dtype;
        v.shape_known = true;
        const json &sizes = tensor_meta_.at(name).at("sizes");
        for (size_t d = 0; d < sizes.size(); ++d) {
          const bool symbolic = !sizes[d].contains("as_int");
          if (d == 0 && !symbolic)
            return fail("input '" + name + "' has a fixed first dimension; export with dynamic_shapes="
                        "{..: {0: torch.export.Dim('batch')}} so the batch is symbolic");
          if (d == 0) {
            v.shape.push_back(ir::Dim::batch());
            continue;
          }
          // Note [symbolic sequence]: another dynamic dimension (the
          // sequence a Hugging Face export declares) is planned at the
          // example's size; the graph reads it through sym_size and runs at any.
          const json *size = symbolic ? &sizes[d].at("as_expr") : &sizes[d];
          if (symbolic && !(size->contains("hint") && size->at("hint").contains("as_int")))
            return fail("input '" + name + "' has a symbolic dimension " + std::to_string(d) +
                        " without an example size; rannc takes the batch (dimension 0) as the only symbolic one");
          const int64_t n = (symbolic ? size->at("hint") : *size).at("as_int").get<int64_t>();
          if (symbolic)
            note(AuditAction::Warning, "dynamic dimension",
                 "dimensions other than the batch that the export declares dynamic: planned (costs, memory) at the "
                 "example's size, trained at the data's",
                 {name + "[" + std::to_string(d) + "] = " + std::to_string(n)});
          v.shape.push_back(ir::Dim::fixed(n));
        }
        const ir::ValueId id = g_.addValue(std::move(v));
        g_.inputs.push_back(id);
        values_[name] = id;
        continue;
      }
      std::string target_key, graph_name;
      ir::ValueKind vk;
      if (kind == "parameter") {
        target_key = "parameter_name";
        vk = ir::ValueKind::Parameter;
      } else if (kind == "buffer") {
        target_key = "buffer_name";
        vk = ir::ValueKind::Buffer;
      } else if (kind == "tensor_constant") {
        target_key = "tensor_constant_name";
        vk = ir::ValueKind::Constant;
      } else {
        return fail("an input of kind '" + kind + "', which rannc does not lower");
      }
      graph_name = body.at("arg").at("name").get<std::string>();
      const std::string state_name = body.at(target_key).get<std::string>();
      auto it = archive_.tensors.find(state_name);
      if (it == archive_.tensors.end()) return fail("the archive has no tensor '" + state_name + "'");
      const std::string &storage = archive_.storage_of.at(state_name);
      const std::string name = canonical_of_storage.emplace(storage, state_name).first->second;
      // A tensor read under two names (tied weights, a constant lifted twice) is one value.
      if (auto w = state_ids_.find(name); w != state_ids_.end()) {
        values_[graph_name] = state_ids_[state_name] = w->second;
        if (vk == ir::ValueKind::Parameter)
          note(AuditAction::Fixed, "tied weight",
               "one tensor stored under several names: one parameter, named as named_parameters() names it",
               {state_name + " = " + name});
        continue;
      }
      const torch::Tensor &t = it->second;
      // The signature says what trains (Note [torch.export lowering]): a
      // buffer, persistent or not, never does, whatever its dtype.
      if (vk == ir::ValueKind::Buffer && t.is_floating_point() && !body.value("persistent", true))
        note(AuditAction::Fixed, "untrained buffer",
             "floating-point non-persistent buffers (an ONNX initializer of theirs would train): kept as "
             "buffers, never trained, as the program's signature says",
             {name});
      if (vk == ir::ValueKind::Parameter && !t.is_floating_point()) {
        note(AuditAction::Warning, "integer parameter",
             "parameters that are not floating point: constants, as no gradient can train them", {name});
        vk = ir::ValueKind::Constant;
      }
      const ir::ValueId id = g_.addValue(tensorValue(uniqueName(name), t, vk));
      if (vk == ir::ValueKind::Parameter) g_.parameters.push_back(id);
      else if (vk == ir::ValueKind::Buffer) g_.buffers.push_back(id);
      else {
        g_.constants.push_back(id);
        g_.constant_data[id] = runtime::fromTorch(t.contiguous());
      }
      if (vk != ir::ValueKind::Constant) weight_ids_.emplace(name, id);
      state_ids_[name] = state_ids_[state_name] = id;
      values_[graph_name] = id;
    }
    return Status::success();
  }

  /// The IR value named `name` (a tensor or a symbolic int produced earlier).
  Expected<ir::ValueId> valueOf(const std::string &name) const {
    auto it = values_.find(name);
    if (it == values_.end()) return Error{where_ + ": '" + name + "' is read before it is produced"};
    return it->second;
  }

  /// Encodes argument `i` of `node` from its serialized form (or the schema default).
  Status encodeArg(const c10::Argument &formal, const json *arg, size_t i, ir::Node &node, const std::string &here) {
    const std::string ti = args::kindKey(i), vi = args::valueKey(i);
    auto &attrs = node.attrs;
    if (!arg) {
      if (!formal.default_value()) return fail(here + ": argument '" + formal.name() + "' is missing");
      const c10::IValue &d = *formal.default_value();
      if (d.isNone()) attrs[ti] = args::kConstNone;
      else if (d.isBool()) attrs[ti] = args::kConstBool, attrs[vi] = int64_t(d.toBool());
      else if (d.isInt()) attrs[ti] = args::kConstInt, attrs[vi] = d.toInt();
      else if (d.isDouble()) attrs[ti] = args::kConstFloat, attrs[vi] = d.toDouble();
      else if (d.isString()) attrs[ti] = args::kConstStr, attrs[vi] = d.toStringRef();
      else if (d.isIntList()) attrs[ti] = args::kConstInts, attrs[vi] = d.toIntVector();
      else if (d.isDoubleList()) attrs[ti] = args::kConstFloats, attrs[vi] = d.toDoubleVector();
      else return fail(here + ": default of '" + formal.name() + "' is of an unsupported kind " + d.tagKind());
      return Status::success();
    }
    const std::string kind = arg->begin().key();
    const json &v = arg->begin().value();
    auto tensorInput = [&](const json &t) -> Status {
      auto id = valueOf(t.at("name").get<std::string>());
      if (!id) return Status(id.error());
      node.inputs.push_back(*id);
      return Status::success();
    };
    if (kind == "as_tensor") {
      attrs[ti] = args::kTensor;
      return tensorInput(v);
    }
    if (kind == "as_tensors") {
      attrs[ti] = args::kTensors;
      attrs[vi] = int64_t(v.size());
      for (const json &t : v)
        if (Status st = tensorInput(t); !st) return st;
      return Status::success();
    }
    if (kind == "as_optional_tensors") { // Tensor?[] (aten.index's indices): "m<i>" marks the tensors
      attrs[ti] = args::kOptTensors;
      attrs[vi] = int64_t(v.size());
      std::vector<int64_t> mask;
      for (const json &e : v) {
        const bool present = e.contains("as_tensor");
        mask.push_back(present);
        if (present)
          if (Status st = tensorInput(e.at("as_tensor")); !st) return st;
      }
      attrs[args::maskKey(i)] = mask;
      return Status::success();
    }
    if (kind == "as_none") return attrs[ti] = args::kConstNone, Status::success();
    // A Python number where the schema wants a Tensor (`x * -10000.0` is
    // aten.mul.Tensor): a wrapped-number tensor, promoted as PyTorch promotes it.
    const bool tensor_formal = formal.type()->kind() == c10::TypeKind::TensorType;
    if (kind == "as_int")
      return attrs[ti] = (tensor_formal ? args::kConstWrappedInt : args::kConstInt), attrs[vi] = v.get<int64_t>(),
             Status::success();
    if (kind == "as_float")
      return attrs[ti] = (tensor_formal ? args::kConstWrappedFloat : args::kConstFloat), attrs[vi] = exportFloat(v),
             Status::success();
    if (kind == "as_bool")
      return attrs[ti] = args::kConstBool, attrs[vi] = int64_t(v.get<bool>()), Status::success();
    if (kind == "as_string")
      return attrs[ti] = args::kConstStr, attrs[vi] = v.get<std::string>(), Status::success();
    if (kind == "as_ints")
      return attrs[ti] = args::kConstInts, attrs[vi] = v.get<std::vector<int64_t>>(), Status::success();
    if (kind == "as_floats")
      return attrs[ti] = args::kConstFloats, attrs[vi] = exportFloats(v), Status::success();
    if (kind == "as_bools") {
      std::vector<int64_t> b;
      for (const json &x : v) b.push_back(x.get<bool>());
      return attrs[ti] = args::kConstBools, attrs[vi] = b, Status::success();
    }
    if (kind == "as_scalar_type") {
      auto st = runtime::scalarTypeFromExport(v.get<int64_t>());
      if (!st) return fail(here + ": " + st.error().message);
      return attrs[ti] = args::kConstInt, attrs[vi] = int64_t(*st), Status::success();
    }
    if (kind == "as_layout") { // serialized Layout 7 is torch.strided, the only one rannc's tensors have
      if (v.get<int64_t>() != 7) return fail(here + ": a sparse or mkldnn layout, which rannc does not run");
      return attrs[ti] = args::kConstInt, attrs[vi] = int64_t(c10::kStrided), Status::success();
    }
    if (kind == "as_memory_format")
      return attrs[ti] = args::kConstInt, attrs[vi] = memoryFormatToC10(v.get<int64_t>()), Status::success();
    if (kind == "as_device") {
      std::string dev = v.at("type").get<std::string>();
      if (v.contains("index") && !v.at("index").is_null()) dev += ":" + std::to_string(v.at("index").get<int64_t>());
      return attrs[ti] = args::kConstDevice, attrs[vi] = dev, Status::success();
    }
    if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool") {
      if (v.contains("as_int")) return attrs[ti] = args::kConstInt, attrs[vi] = v.at("as_int").get<int64_t>(), Status::success();
      if (v.contains("as_float")) return attrs[ti] = args::kConstFloat, attrs[vi] = exportFloat(v.at("as_float")), Status::success();
      if (v.contains("as_bool")) return attrs[ti] = args::kConstBool, attrs[vi] = int64_t(v.at("as_bool").get<bool>()), Status::success();
      auto id = valueOf(v.at("as_name").get<std::string>());
      if (!id) return Status(id.error());
      if (tensor_formal && kind != "as_sym_bool") // `x * torch.sym_min(n, 256)`: a number computed at run time
        attrs[ti] = kind == "as_sym_int" ? args::kWrappedInt : args::kWrappedFloat;
      else attrs[ti] = (kind == "as_sym_int" ? args::kInt : kind == "as_sym_float" ? args::kFloat : args::kBool);
      node.inputs.push_back(*id);
      return Status::success();
    }
    if (kind == "as_sym_ints") {
      bool all_const = true;
      for (const json &e : v) all_const = all_const && e.contains("as_int");
      if (all_const) {
        std::vector<int64_t> ints;
        for (const json &e : v) ints.push_back(e.at("as_int").get<int64_t>());
        return attrs[ti] = args::kConstInts, attrs[vi] = ints, Status::success();
      }
      // Sizes computed at run time: their own list node (runtime/kernels/aten.cpp's prim::ListConstruct).
      ir::Node list;
      list.name = node.name + "_" + formal.name();
      list.op_type = "prim::ListConstruct";
      list.domain = "aten";
      list.attrs[args::kOverload] = std::string();
      list.attrs[args::kNargs] = int64_t(v.size());
      for (size_t k = 0; k < v.size(); ++k) {
        const std::string tk = args::kindKey(k), vk = args::valueKey(k);
        if (v[k].contains("as_int")) {
          list.attrs[tk] = args::kConstInt;
          list.attrs[vk] = v[k].at("as_int").get<int64_t>();
        } else {
          auto id = valueOf(v[k].at("as_name").get<std::string>());
          if (!id) return Status(id.error());
          list.attrs[tk] = args::kInt;
          list.inputs.push_back(*id);
        }
      }
      ir::Value lv;
      lv.name = uniqueName(list.name);
      const ir::ValueId lid = g_.addValue(std::move(lv));
      list.outputs.push_back(lid);
      g_.addNode(std::move(list));
      attrs[ti] = args::kInts;
      node.inputs.push_back(lid);
      return Status::success();
    }
    return fail(here + ": argument '" + formal.name() + "' is serialized as " + kind + ", which rannc does not lower");
  }

  /// The module path of `n` (`model.layers.3.mlp`) from its nn_module_stack
  /// metadata ("key,path,type;..." outermost first); empty at the root.
  static std::string modulePath(const json &n) {
    if (!n.contains("metadata") || !n.at("metadata").contains("nn_module_stack")) return "";
    const std::string stack = n.at("metadata").at("nn_module_stack").get<std::string>();
    const std::string last = stack.substr(stack.rfind(';') == std::string::npos ? 0 : stack.rfind(';') + 1);
    const auto a = last.find(','), b = last.find(',', a == std::string::npos ? a : a + 1);
    if (a == std::string::npos || b == std::string::npos) return "";
    const std::string path = last.substr(a + 1, b - a - 1);
    return path.rfind("_empty", 0) == 0 ? "" : path;
  }

  /// `name`, or `name` with a suffix when an IR value already has it (an
  /// inlined region's names repeat the program's).
  std::string uniqueName(const std::string &name) {
    std::string out = name;
    for (int k = 1; !used_names_.insert(out).second; ++k) out = name + "_" + std::to_string(k);
    return out;
  }

  /// The IR value a serialized tensor or sym-int argument names.
  Expected<ir::ValueId> argValue(const json &arg, const std::string &here) const {
    if (arg.contains("as_tensor")) return valueOf(arg.at("as_tensor").at("name").get<std::string>());
    for (const char *k : {"as_sym_int", "as_sym_float", "as_sym_bool"})
      if (arg.contains(k) && arg.at(k).contains("as_name")) return valueOf(arg.at(k).at("as_name").get<std::string>());
    return Error{where_ + ": " + here + ": a region operand or result that is not a tensor or symbolic number"};
  }

  /// The names of a node's or a region's results, flattened.
  static std::vector<std::string> resultNames(const json &outputs) {
    std::vector<std::string> names;
    for (const json &out : outputs) {
      const std::string kind = out.begin().key();
      const json &v = out.begin().value();
      if (kind == "as_tensor") names.push_back(v.at("name").get<std::string>());
      else if (kind == "as_tensors")
        for (const json &t : v) names.push_back(t.at("name").get<std::string>());
      else if (v.is_object() && v.contains("as_name")) names.push_back(v.at("as_name").get<std::string>());
    }
    return names;
  }

  /// An ATen node `op` on the tensors `ins`, named `name` (aten::detach;
  /// aten::copy_ with non_blocking=False); its output.
  ir::ValueId tensorNode(const std::string &op, const std::string &name, std::vector<ir::ValueId> ins) {
    ir::Node node;
    node.name = name;
    node.op_type = op;
    node.domain = "aten";
    node.attrs[args::kOverload] = std::string();
    node.attrs[args::kNargs] = int64_t(ins.size());
    for (size_t i = 0; i < ins.size(); ++i) node.attrs[args::kindKey(i)] = args::kTensor;
    if (op == "aten::copy_") {
      node.attrs[args::kNargs] = int64_t(3);
      node.attrs[args::kindKey(2)] = args::kConstBool;
      node.attrs[args::valueKey(2)] = int64_t(0);
    }
    node.inputs = std::move(ins);
    ir::Value v;
    v.name = uniqueName(name);
    const ir::ValueId id = g_.addValue(std::move(v));
    node.outputs.push_back(id);
    g_.addNode(std::move(node));
    return id;
  }

  // Note [higher-order regions]
  // torch.export keeps a region run under another mode as a higher-order op
  // whose subgraph is an argument: transformers' rotary embeddings run under
  // torch.no_grad() (wrap_with_set_grad_enabled(False, graph, *operands)),
  // and under torch.autocast(enabled=False) (wrap_with_autocast(device,
  // dtype, enabled, cache, graph, *operands)). The subgraph is inlined, its
  // inputs bound to the operands. A region without gradients ends in
  // aten::detach on each tensor result: autograd then stops there, as
  // PyTorch's no_grad stops it. An enabled autocast region would run in
  // another precision than the rest, which rannc sets per plan
  // (--precision), so it is refused; so are the other higher-order ops
  // (torch.cond, checkpoint, custom ops), which compute something else.
  Status lowerRegion(const json &n, const std::string &target, const std::string &here) {
    const json &ins = n.at("inputs");
    size_t at = ins.size();
    for (size_t i = 0; i < ins.size() && at == ins.size(); ++i)
      if (ins[i].at("arg").contains("as_graph")) at = i;
    bool grad = true;
    if (target == "torch.ops.higher_order.wrap_with_set_grad_enabled" && at == 1) {
      grad = ins[0].at("arg").at("as_bool").get<bool>();
    } else if (target == "torch.ops.higher_order.wrap_with_autocast" && at == 4) {
      const json &enabled = ins[2].at("arg");
      if (!enabled.contains("as_bool") || enabled.at("as_bool").get<bool>())
        return refuse("autocast region", here + " runs a region under an enabled torch.autocast; rannc sets one "
                                                "precision for the whole model (rannc-plan --precision bf16|fp16): "
                                                "export without autocast in forward");
    } else {
      return refuse("higher-order op", here + " is a higher-order op rannc does not lower: it inlines "
                                              "no_grad/enable_grad regions (wrap_with_set_grad_enabled) and disabled "
                                              "autocast regions; torch.cond, checkpointing and custom ops are refused");
    }
    const json &sub = ins[at].at("arg").at("as_graph").at("graph");
    const json &params = sub.at("inputs");
    if (params.size() != ins.size() - at - 1) return fail(here + ": its subgraph's inputs do not match its operands");
    std::map<std::string, ir::ValueId> scope;
    for (size_t k = 0; k < params.size(); ++k) {
      auto operand = argValue(ins[at + 1 + k].at("arg"), here);
      if (!operand) return Status(operand.error());
      for (const std::string &name : resultNames(json::array({params[k]}))) scope[name] = *operand;
    }
    std::swap(scope, values_); // the region sees its own names only
    ++region_depth_;
    Status lowered = Status::success();
    for (const json &inner : sub.at("nodes"))
      if (lowered = lowerNode(inner); !lowered) break;
    --region_depth_;
    std::vector<ir::ValueId> results;
    if (lowered)
      for (const json &out : sub.at("outputs")) {
        auto r = argValue(out, here);
        if (!r) {
          lowered = Status(r.error());
          break;
        }
        results.push_back(*r);
      }
    std::swap(scope, values_);
    if (!lowered) return lowered;
    const std::vector<std::string> names = resultNames(n.at("outputs"));
    if (names.size() != results.size()) return fail(here + ": its results do not match its subgraph's outputs");
    const std::string path = modulePath(n);
    if (!grad)
      note(AuditAction::Fixed, "no_grad region",
           "regions run under torch.no_grad(): inlined, their results detached so no gradient flows through them, "
           "as in PyTorch",
           {path.empty() ? here : path});
    for (size_t k = 0; k < names.size(); ++k) {
      const bool tensor = sub.at("outputs")[k].contains("as_tensor");
      values_[names[k]] = grad || !tensor ? results[k]
                                          : tensorNode("aten::detach", (path.empty() ? "" : path + "/") + names[k],
                                                      {results[k]});
      if (Status st = applyMutation(names[k]); !st) return st;
    }
    return Status::success();
  }

  // Note [buffer mutations]
  // A functionalized program (run_decompositions()) does not update buffers
  // in place: it returns each new value as a buffer_mutation output
  // (BatchNorm's running statistics from _native_batch_norm_legit_functional,
  // num_batches_tracked + 1), and PyTorch copies it into the buffer after
  // forward. The lowering writes it in place right where the value is made,
  // aten::copy_(buffer, detach(new)), so the stage that computes it updates
  // its own buffer once per forward, as aten.batch_norm and aten.add_ do in
  // the program torch.export.export returns.
  Status applyMutation(const std::string &graph_name) {
    auto m = mutations_.find(graph_name);
    if (region_depth_ > 0 || m == mutations_.end()) return Status::success(); // a region's names are its own
    auto buffer = state_ids_.find(m->second);
    if (buffer == state_ids_.end()) return fail("buffer_mutation of '" + m->second + "', which is no input buffer");
    auto value = valueOf(graph_name);
    if (!value) return Status(value.error());
    const std::string base = g_.values[buffer->second].name + "/update";
    note(AuditAction::Fixed, "buffer mutation",
         "buffers a functionalized program writes back: updated in place where the new value is computed, once "
         "per forward",
         {g_.values[buffer->second].name});
    const ir::ValueId detached = tensorNode("aten::detach", base + "_detach", {*value});
    tensorNode("aten::copy_", base, {buffer->second, detached});
    return Status::success();
  }

  Status lowerNode(const json &n) {
    const int index = index_++;
    const std::string target = n.at("target").get<std::string>();
    if (isAssertion(target)) return Status::success();
    const std::string here = "node '" + n.value("name", std::to_string(index)) + "' (" + target + ")";
    if (target.rfind("torch.ops.higher_order.", 0) == 0) return lowerRegion(n, target, here);
    auto op = operatorName(target);
    if (!op)
      return fail(here + " is not an ATen operator (higher-order ops such as torch.cond, and custom ops other than "
                         "transformers' grouped_mm_fallback, are not lowered)");
    runtime::registerLibraryOps();
    std::shared_ptr<torch::jit::Operator> jop = torch::jit::findOperatorFor(c10::OperatorName(op->first, op->second));
    if (!jop) return fail(here + ": this LibTorch (" + std::string(TORCH_VERSION) + ") has no operator " + op->first +
                          (op->second.empty() ? "" : "." + op->second));
    const c10::FunctionSchema &schema = jop->schema();
    ir::Node node;
    // Readable plans: the op's module path, as ONNX exporters name nodes.
    const std::string path = modulePath(n);
    node.name = (path.empty() ? "" : path + "/") + n.value("name", op->first.substr(6) + "_" + std::to_string(index));
    node.op_type = op->first;
    node.domain = "aten";
    node.attrs[args::kOverload] = op->second;
    node.attrs[args::kNargs] = int64_t(schema.arguments().size());
    std::map<std::string, const json *> given;
    for (const json &in : n.at("inputs")) given[in.at("name").get<std::string>()] = &in.at("arg");
    for (size_t i = 0; i < schema.arguments().size(); ++i) {
      const c10::Argument &formal = schema.arguments()[i];
      auto it = given.find(formal.name());
      if (Status st = encodeArg(formal, it == given.end() ? nullptr : it->second, i, node, here); !st) return st;
    }
    for (const json &out : n.at("outputs")) {
      const std::string kind = out.begin().key();
      const json &v = out.begin().value();
      auto define = [&](const std::string &name) {
        ir::Value iv;
        iv.name = uniqueName(name);
        const ir::ValueId id = g_.addValue(std::move(iv));
        values_[name] = id;
        node.outputs.push_back(id);
      };
      if (kind == "as_tensor") {
        define(v.at("name").get<std::string>());
      } else if (kind == "as_tensors") {
        node.attrs[args::kListOut] = int64_t(v.size());
        for (const json &t : v) define(t.at("name").get<std::string>());
      } else if (kind == "as_sym_int" || kind == "as_sym_float" || kind == "as_sym_bool") {
        define(v.at("as_name").get<std::string>());
      } else if (kind == "as_none") {
        node.outputs.push_back(ir::kNoValue);
      } else {
        return fail(here + ": an output serialized as " + kind + ", which rannc does not lower");
      }
    }
    const std::vector<std::string> produced = resultNames(n.at("outputs"));
    g_.addNode(std::move(node));
    for (const std::string &name : produced)
      if (Status st = applyMutation(name); !st) return st;
    return Status::success();
  }

  const json &program_;
  const runtime::Pt2Archive &archive_;
  std::string where_;
  ImportAudit *audit_;
  json tensor_meta_;
  ir::Graph g_;
  std::map<std::string, ir::ValueId> values_;     // graph names -> IR values
  std::map<std::string, ir::ValueId> weight_ids_; // canonical weight names
  std::map<std::string, ir::ValueId> state_ids_;  // every state_dict / constant name -> its value
  std::map<std::string, std::string> mutations_;  // new value's graph name -> buffer it writes
  std::set<std::string> used_names_;              // IR value names taken
  int index_ = 0;
  int region_depth_ = 0;
};

} // namespace

Expected<ir::Graph> importTorchExport(const std::string &path, ImportAudit *audit) {
  auto archive = runtime::readPt2Archive(path);
  if (!archive) return archive.error();
  Lowering lowering(archive->program, *archive, path, audit);
  auto graph = [&]() -> Expected<ir::Graph> {
    try {
      return lowering.run();
    } catch (const nlohmann::json::exception &e) {
      return Error{path + ": malformed torch.export program: " + firstLine(e.what())};
    }
  }();
  if (!graph) return graph.error();
  if (Status st = findShapesByRunning(*graph, lowering.weights(), path); !st) return Error{st.message()};
  return graph;
}

} // namespace rannc::import
