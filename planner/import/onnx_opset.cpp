#include "planner/import/onnx_opset.h"

#include <onnx/defs/schema.h>
#include <onnx/defs/shape_inference.h>

#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "planner/import/onnx_import.h"

namespace rannc::import {

// Note [newer opsets]
// PyTorch 2.x's default (dynamo) exporter writes opset 18 and newer, IR
// version 10; Debian's libonnx 1.12, whose schemas and shape inference the
// importer uses, stops at opset 17. Rather than building a newer ONNX at
// set-up, a model of opset 18-22 is rewritten into the opset-17 forms of its
// ops before anything else reads it, and then imports, plans and runs like an
// opset-17 model (the kernels implement opset-17 semantics). Between 17 and 22
// most ops only gained element types; the ones whose signature changed are
// rewritten here:
//   - ReduceMax/Min/Mean/Prod/L1/L2/LogSum/LogSumExp/SumSquare (18) take axes
//     as an input: a constant one becomes the `axes` attribute again;
//   - Split (18) may give `num_outputs` instead of sizes: with no sizes, opset
//     13's Split already splits evenly into as many parts as it has outputs;
//   - SplitToSequence + SequenceAt (the unoptimized export of torch.split) with
//     constant indices become one Slice per element;
//   - Gelu (20) is new: it keeps its name in a private domain whose schema
//     (elementwise, attribute `approximate`) is registered here; so do
//     BitwiseAnd/Or/Xor (18, on integers, broadcasting) and BitwiseNot (18);
//   - attributes added after 17 (AveragePool's and LpPool's dilations, Resize's
//     antialias, Cast's saturate, ...) are dropped when they hold the value
//     that means the opset-17 behaviour (kAddedAttrs).
// Uses the rewrite cannot express (Pad's axes input, a dilated average pool,
// Resize with antialias, opset 23's Attention, ...) are refused by name.

namespace {

constexpr int64_t kKnownOpset = 17; // libonnx 1.12's newest

/// The opset at which an op's signature changed beyond 17 without a rewrite
/// here; a model at or past it that uses the op is refused.
const std::map<std::string, int64_t> &unrewrittenChanges() {
  static const std::map<std::string, int64_t> kChanges = {
      {"Col2Im", 18},     {"DFT", 20},         {"GridSample", 20},  {"GroupNormalization", 18},
      {"DeformConv", 19}, {"AffineGrid", 20},  {"Mish", 18},        {"CenterCropPad", 18},
      {"Attention", 23},  {"RMSNormalization", 23}, {"RotaryEmbedding", 23}};
  return kChanges;
}

/// An attribute added after opset 17 whose default means the opset-17
/// behaviour: dropped when it holds that default (ints: all equal to it),
/// refused otherwise. (op, since, attribute, default int, default string).
struct AddedAttr {
  const char *op;
  int64_t since;
  const char *name;
  int64_t int_default;
  const char *string_default; ///< nullptr: an int or ints attribute
};
constexpr AddedAttr kAddedAttrs[] = {
    {"AveragePool", 19, "dilations", 1, nullptr},          {"LpPool", 18, "dilations", 1, nullptr},
    {"LpPool", 18, "ceil_mode", 0, nullptr},               {"Resize", 18, "antialias", 0, nullptr},
    {"Resize", 18, "keep_aspect_ratio_policy", 0, "stretch"}, {"Pad", 19, "mode", 0, nullptr},
    {"ScatterElements", 18, "reduction", 0, nullptr},      {"ScatterND", 18, "reduction", 0, nullptr},
    {"Cast", 19, "saturate", 1, nullptr}};

/// Drops `n`'s attributes of kAddedAttrs that hold their defaults; the
/// problem ("" if none) for one that does not.
std::string dropDefaultAddedAttrs(onnx::NodeProto &n, int64_t opset) {
  for (const AddedAttr &a : kAddedAttrs) {
    if (n.op_type() != a.op || opset < a.since) continue;
    auto *attrs = n.mutable_attribute();
    for (int i = 0; i < attrs->size(); ++i) {
      const onnx::AttributeProto &at = attrs->Get(i);
      if (at.name() != a.name) continue;
      bool is_default = false;
      const std::string name = a.name;
      if (name == "mode" || name == "reduction") // values the opset-17 op does not have
        is_default = at.s() != "wrap" && at.s() != "max" && at.s() != "min";
      else if (a.string_default)
        is_default = at.s() == a.string_default;
      else if (name == "saturate")
        is_default = true; // only concerns float8 types, which rannc does not have
      else if (at.type() == onnx::AttributeProto::INT)
        is_default = at.i() == a.int_default;
      else {
        is_default = true;
        for (int64_t v : at.ints()) is_default = is_default && v == a.int_default;
      }
      if (!is_default)
        return "attribute " + name + " (opset " + std::to_string(a.since) + ") has a value rannc does not run";
      if (name != "mode" && name != "reduction") attrs->DeleteSubrange(i, 1);
      break;
    }
  }
  return "";
}

bool isDefaultDomain(const std::string &d) { return d.empty() || d == "ai.onnx"; }

const std::set<std::string> &axesInputReductions() {
  static const std::set<std::string> kOps = {"ReduceMax",    "ReduceMin",    "ReduceMean",      "ReduceProd",
                                             "ReduceL1",     "ReduceL2",     "ReduceLogSum",    "ReduceLogSumExp",
                                             "ReduceSumSquare"};
  return kOps;
}

/// The bitwise ops of opset 18, which opset 17 lacks (Note [newer opsets]).
const std::set<std::string> &newBitwiseOps() {
  static const std::set<std::string> kOps = {"BitwiseAnd", "BitwiseNot", "BitwiseOr", "BitwiseXor"};
  return kOps;
}

/// Registers the schemas of ops newer than opset 17 under kNewOpsDomain, once.
void registerNewOpSchemas() {
  static std::once_flag once;
  std::call_once(once, [] {
    onnx::OpSchemaRegistry::DomainToVersionRange::Instance().AddDomainToVersion(kNewOpsDomain, 1, 1);
    onnx::OpSchema gelu;
    gelu.SetName("Gelu")
        .SetDomain(kNewOpsDomain)
        .SinceVersion(1)
        .Attr("approximate", "none or tanh", onnx::AttributeProto::STRING, std::string("none"))
        .Input(0, "X", "input", "T")
        .Output(0, "Y", "output", "T")
        .TypeConstraint("T", {"tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"},
                        "floating-point tensors")
        .TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
    onnx::OpSchemaRegistry::OpSchemaRegisterOnce registered(gelu);
    (void)registered;
    // ONNX 1.13's Bitwise* schemas: integer tensors of one type; the binary
    // ones broadcast as numpy does.
    const std::vector<std::string> ints = {"tensor(uint8)",  "tensor(uint16)", "tensor(uint32)", "tensor(uint64)",
                                           "tensor(int8)",   "tensor(int16)",  "tensor(int32)",  "tensor(int64)"};
    for (const std::string &op : newBitwiseOps()) {
      onnx::OpSchema s;
      s.SetName(op).SetDomain(kNewOpsDomain).SinceVersion(1).TypeConstraint("T", ints, "integer tensors");
      if (op == "BitwiseNot") {
        s.Input(0, "X", "input", "T").Output(0, "Y", "output", "T");
        s.TypeAndShapeInferenceFunction(onnx::propagateShapeAndTypeFromFirstInput);
      } else {
        s.Input(0, "A", "first input", "T").Input(1, "B", "second input", "T").Output(0, "C", "result", "T");
        s.TypeAndShapeInferenceFunction([](onnx::InferenceContext &ctx) {
          onnx::propagateElemTypeFromInputToOutput(ctx, 0, 0);
          if (onnx::hasNInputShapes(ctx, 2))
            onnx::bidirectionalBroadcastShapeInference(ctx.getInputType(0)->tensor_type().shape(),
                                                       ctx.getInputType(1)->tensor_type().shape(),
                                                       *ctx.getOutputType(0)->mutable_tensor_type()->mutable_shape());
        });
      }
      onnx::OpSchemaRegistry::OpSchemaRegisterOnce done(s);
      (void)done;
    }
  });
}

/// Constant int64 values by name: initializers, Constant nodes' outputs, and
/// what the unoptimized export computes from them without changing the values
/// (Reshape, Squeeze, Unsqueeze, Flatten, Identity, Cast of a constant, and
/// Concat of constants: alexnet's mean axes are Reshape(Constant, Constant)).
class Constants {
public:
  explicit Constants(const onnx::GraphProto &g) {
    for (const auto &t : g.initializer()) tensors_[t.name()] = &t;
    static const std::set<std::string> kSameValues = {"Reshape", "Squeeze", "Unsqueeze", "Flatten", "Identity",
                                                      "Cast"};
    for (const auto &n : g.node()) {
      if (!isDefaultDomain(n.domain()) || n.output_size() != 1) continue;
      if (n.op_type() == "Constant") {
        for (const auto &a : n.attribute()) {
          if (a.name() == "value" && a.has_t()) tensors_[n.output(0)] = &a.t();
          else if (a.name() == "value_int") ints_[n.output(0)] = {a.i()};
          else if (a.name() == "value_ints") ints_[n.output(0)].assign(a.ints().begin(), a.ints().end());
        }
      } else if (kSameValues.count(n.op_type()) && n.input_size() >= 1) {
        if (auto v = ints(n.input(0))) ints_[n.output(0)] = *v;
      } else if (n.op_type() == "Concat") {
        std::vector<int64_t> all;
        bool known = n.input_size() > 0;
        for (const auto &in : n.input()) {
          auto v = ints(in);
          if (!v) known = false;
          else all.insert(all.end(), v->begin(), v->end());
        }
        if (known) ints_[n.output(0)] = std::move(all);
      }
    }
  }

  /// The int64 contents of `name`, or nullopt when it is not a constant.
  std::optional<std::vector<int64_t>> ints(const std::string &name) const {
    if (auto it = ints_.find(name); it != ints_.end()) return it->second;
    auto it = tensors_.find(name);
    if (it == tensors_.end()) return std::nullopt;
    auto t = tensorFromOnnx(*it->second, name);
    if (!t || (t->dtype != ir::DType::I64 && t->dtype != ir::DType::I32)) return std::nullopt;
    std::vector<int64_t> out;
    if (t->dtype == ir::DType::I64) {
      out.resize(t->data.size() / sizeof(int64_t));
      std::memcpy(out.data(), t->data.data(), out.size() * sizeof(int64_t));
    } else {
      std::vector<int32_t> v(t->data.size() / sizeof(int32_t));
      std::memcpy(v.data(), t->data.data(), v.size() * sizeof(int32_t));
      out.assign(v.begin(), v.end());
    }
    return out;
  }

private:
  std::map<std::string, const onnx::TensorProto *> tensors_;
  std::map<std::string, std::vector<int64_t>> ints_;
};

onnx::AttributeProto *findAttr(onnx::NodeProto &n, const std::string &name) {
  for (auto &a : *n.mutable_attribute())
    if (a.name() == name) return &a;
  return nullptr;
}

void removeAttr(onnx::NodeProto &n, const std::string &name) {
  auto *attrs = n.mutable_attribute();
  for (int i = 0; i < attrs->size(); ++i)
    if (attrs->Get(i).name() == name) {
      attrs->DeleteSubrange(i, 1);
      return;
    }
}

std::string nodeWhere(const std::string &where, const onnx::NodeProto &n, int index) {
  return where + ": node '" + (n.name().empty() ? "#" + std::to_string(index) : n.name()) + "' (" + n.op_type() +
         ")";
}

/// A fresh int64 initializer named `name` holding `v`.
void addInts(onnx::GraphProto &g, const std::string &name, const std::vector<int64_t> &v) {
  onnx::TensorProto *t = g.add_initializer();
  t->set_name(name);
  t->set_data_type(onnx::TensorProto::INT64);
  t->add_dims(int64_t(v.size()));
  for (int64_t x : v) t->add_int64_data(x);
}

} // namespace

Expected<int64_t> lowerToKnownOpset(onnx::ModelProto &model, const std::string &where) {
  int64_t opset = 0;
  for (const auto &os : model.opset_import())
    if (isDefaultDomain(os.domain())) opset = os.version();
  if (opset <= kKnownOpset) return opset;
  if (opset > kNewestOpset)
    return Error{where + ": model uses ONNX opset " + std::to_string(opset) + ", newer than rannc reads (up to " +
                 std::to_string(kNewestOpset) + "); export with opset_version=" + std::to_string(kNewestOpset) +
                 " or lower"};
  if (model.functions_size() > 0)
    return Error{where + ": the model defines local functions (" + model.functions(0).domain() + "." +
                 model.functions(0).name() +
                 ", ...), which rannc does not inline yet; export with torch.onnx.export(..., optimize=True) or "
                 "inline them with onnx.inliner.inline_local_functions"};
  registerNewOpSchemas();
  onnx::GraphProto &g = *model.mutable_graph();
  const Constants constants(g);

  // Who reads each value (for the SplitToSequence rewrite).
  std::map<std::string, std::vector<int>> readers;
  for (int i = 0; i < g.node_size(); ++i)
    for (const auto &in : g.node(i).input()) readers[in].push_back(i);

  std::vector<onnx::NodeProto> out;
  out.reserve(size_t(g.node_size()));
  std::set<int> consumed; // SequenceAt nodes folded into their SplitToSequence
  int fresh = 0;
  for (int i = 0; i < g.node_size(); ++i) {
    if (consumed.count(i)) continue;
    onnx::NodeProto n = g.node(i);
    const std::string here = nodeWhere(where, n, i);
    if (!isDefaultDomain(n.domain())) {
      out.push_back(std::move(n));
      continue;
    }
    const std::string &op = n.op_type();
    if (std::string problem = dropDefaultAddedAttrs(n, opset); !problem.empty()) return Error{here + ": " + problem};
    if (auto c = unrewrittenChanges().find(op); c != unrewrittenChanges().end() && opset >= c->second)
      return Error{here + ": op " + op + " as of opset " + std::to_string(c->second) +
                   " is not supported (rannc reads opset 18+ by rewriting to opset 17, Note [newer opsets]); "
                   "export with opset_version=17"};
    if (axesInputReductions().count(op)) {
      if (n.input_size() >= 2 && !n.input(1).empty()) {
        auto axes = constants.ints(n.input(1));
        if (!axes) return Error{here + ": its axes are computed at run time; rannc needs constant reduction axes"};
        onnx::AttributeProto *a = n.add_attribute();
        a->set_name("axes");
        a->set_type(onnx::AttributeProto::INTS);
        for (int64_t x : *axes) a->add_ints(x);
        n.mutable_input()->RemoveLast();
      } else if (const auto *noop = findAttr(n, "noop_with_empty_axes"); noop && noop->i() != 0) {
        n.set_op_type("Identity");
        n.clear_attribute();
      }
      removeAttr(n, "noop_with_empty_axes");
    } else if (op == "Split") {
      removeAttr(n, "num_outputs"); // opset 13: no sizes = equal parts, one per output
    } else if (op == "Pad" && n.input_size() >= 4 && !n.input(3).empty()) {
      return Error{here + ": its axes input (opset 18) is not supported; rannc pads every axis"};
    } else if (op == "Gelu" || newBitwiseOps().count(op)) {
      n.set_domain(kNewOpsDomain);
    } else if (op == "SplitToSequence") {
      // Every reader must be SequenceAt with a constant index >= 0.
      int64_t axis = 0, keepdims = 1;
      if (const auto *a = findAttr(n, "axis")) axis = a->i();
      if (const auto *a = findAttr(n, "keepdims")) keepdims = a->i();
      std::optional<std::vector<int64_t>> sizes;
      if (n.input_size() >= 2 && !n.input(1).empty()) {
        sizes = constants.ints(n.input(1));
        if (!sizes) return Error{here + ": its split sizes are computed at run time; rannc needs constant ones"};
      }
      for (int r : readers[n.output(0)]) {
        const onnx::NodeProto &at = g.node(r);
        std::optional<std::vector<int64_t>> index;
        if (at.op_type() == "SequenceAt" && at.input_size() == 2) index = constants.ints(at.input(1));
        if (!index || index->size() != 1 || (*index)[0] < 0)
          return Error{here + ": its sequence is read by " + at.op_type() +
                       " (node '" + at.name() + "'); rannc takes sequences apart only with SequenceAt at a constant "
                       "index >= 0"};
        const int64_t k = (*index)[0];
        int64_t start = k, end = k + 1; // no sizes: pieces of 1
        if (sizes && sizes->size() == 1) {
          start = k * (*sizes)[0];
          end = start + (*sizes)[0];
        } else if (sizes) {
          if (k >= int64_t(sizes->size())) return Error{here + ": SequenceAt reads past the last piece"};
          start = 0;
          for (int64_t j = 0; j < k; ++j) start += (*sizes)[size_t(j)];
          end = start + (*sizes)[size_t(k)];
        }
        const std::string base = n.output(0) + "__rannc" + std::to_string(fresh++);
        addInts(g, base + "_starts", {start});
        addInts(g, base + "_ends", {end});
        addInts(g, base + "_axes", {axis});
        onnx::NodeProto slice;
        slice.set_name(at.name().empty() ? base : at.name());
        slice.set_op_type("Slice");
        slice.add_input(n.input(0));
        slice.add_input(base + "_starts");
        slice.add_input(base + "_ends");
        slice.add_input(base + "_axes");
        const bool squeeze = !sizes && keepdims == 0;
        slice.add_output(squeeze ? base + "_piece" : at.output(0));
        out.push_back(slice);
        if (squeeze) {
          onnx::NodeProto sq;
          sq.set_name(base + "_squeeze");
          sq.set_op_type("Squeeze");
          sq.add_input(base + "_piece");
          sq.add_input(base + "_axes");
          sq.add_output(at.output(0));
          out.push_back(sq);
        }
        consumed.insert(r);
      }
      continue;
    }
    out.push_back(std::move(n));
  }
  g.clear_node();
  for (auto &n : out) *g.add_node() = std::move(n);
  for (auto &os : *model.mutable_opset_import())
    if (isDefaultDomain(os.domain())) os.set_version(kKnownOpset);
  onnx::OperatorSetIdProto *own = model.add_opset_import();
  own->set_domain(kNewOpsDomain);
  own->set_version(1);
  if (model.ir_version() > 8) model.set_ir_version(8); // 1.12's newest; 9-10 add nothing these graphs use
  return opset;
}

} // namespace rannc::import
