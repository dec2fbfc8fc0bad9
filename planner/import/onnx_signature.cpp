#include "planner/import/onnx_signature.h"

#include <google/protobuf/unknown_field_set.h>
#include <onnx/onnx_pb.h>

#include <algorithm>
#include <map>
#include <regex>
#include <sstream>
#include <tuple>
#include <vector>

#include "planner/import/onnx_import.h"
#include "planner/import/onnx_weights.h"

namespace rannc::import {

// Note [export signature]
// torch.onnx.export's default (dynamo) exporter writes the model torch.export
// traced, and then optimizes it (optimize=True): it folds every subgraph of
// constants into a new initializer and merges initializers with equal
// contents. A parameter is a constant to that optimizer, so the file holds
// weights PyTorch never had (a Linear's transposed weight, a tied embedding's
// transpose, an embedding row table looked up at fixed positions), loses
// parameters (a BatchNorm that is the identity at initialisation, a position
// embedding) and merges others (every LayerNorm weight that starts at ones).
// Taken at its word, the file would train all of these as parameters.
//
// The exporter records what it started from: the graph's metadata
// `pkg.torch.export.ExportedProgram.graph_signature` lists each parameter and
// buffer by its placeholder (`p_model_h_0_ln_2_weight: PARAMETER
// target='model.h.0.ln_2.weight'`), and each node's metadata
// `pkg.torch.onnx.fx_node` is the FX node it came from, naming the
// placeholders that node read. restoreSignature uses both:
//   - a computation the optimizer merged into an equal one of another
//     module runs again on its own parameters (Note [merged computations]);
//   - a parameter initializer read by a node whose FX node names another,
//     missing parameter of the same leaf name (`weight`, `bias`) was merged
//     into it: that node reads a copy under the missing name again;
//   - a folded initializer that equals the transpose (or a copy) of a
//     parameter its reader's FX node names becomes that op on the parameter
//     again, so the weight trains once, tied; when that parameter itself is
//     gone (the optimizer folded a Linear's weight into its transpose and
//     dropped the weight), the parameter is restored from the folded copy,
//     by the layout its reader implies (a MatMul of aten.linear reads the
//     weight transposed, a Gemm as its transB says);
//   - a parameter with no initializer that a surviving FX node names was
//     folded into other weights (BatchNorm into its convolution), and one
//     named by none was tied to another parameter (its module or a submodule
//     still runs and reads a parameter of the same leaf name) or looked up at fixed
//     positions and folded: the folded ones are refused, the tied one noted;
//   - a Gemm or Conv whose zero bias the optimizer dropped reads a zero
//     parameter of the bias's name again;
//   - inputs with a fixed batch dimension are refused: torch.export bakes
//     the size into every reshape, and rannc splits the batch;
//   - a BatchNormalization whose FX node is training-mode batch norm but
//     which the exporter wrote for inference is put back in training mode,
//     with PyTorch's momentum, and its running statistics stay buffers.
//   - a Gather whose FX node is `aten.embedding` with a padding_idx keeps
//     it (Note [embedding padding row]).
// Every other floating-point initializer the signature does not name as a
// parameter (folded masks and scales, rotary tables, buffers) is a constant:
// PyTorch does not train it. A graph without a signature (the legacy
// exporter, other tools) is taken as before (Note [buffers]).

// Note [embedding padding row]
// nn.Embedding(padding_idx=p) never trains row p: aten.embedding's backward
// leaves that row's gradient zero. The exporter writes the lookup as a plain
// Gather, which trains every row it reads, so where the data holds token p
// (Ministral 3's pad token is 11, an ordinary id in its data) the ONNX model
// drifts from PyTorch from the first update (1.7e-3 in 8 steps). The FX node
// keeps the argument (`aten.embedding.default](args = (%w, %ids, 11)`):
// restoreSignature records it by the Gather's output, the importer sets the
// IR node's `padding_idx`, and the executor's Gather runs aten::embedding
// with it (executor/runtime/kernels/indexing.cpp), whose backward is
// PyTorch's. The legacy TorchScript-based exporter records no FX node: its
// Gathers train the row (docs/front-ends.md).

namespace {

constexpr int kNodeMetadataField = 9;   // NodeProto.metadata_props (ONNX 1.16)
constexpr int kGraphMetadataField = 16; // GraphProto.metadata_props (ONNX 1.16)

/// The metadata_props of a message whose ONNX version predates the field: unknown fields to this build's ONNX.
template <typename Msg> std::map<std::string, std::string> metadata(const Msg &m, int field) {
  std::map<std::string, std::string> out;
  const auto &unknown = m.unknown_fields();
  for (int i = 0; i < unknown.field_count(); ++i) {
    const auto &f = unknown.field(i);
    if (f.number() != field || f.type() != google::protobuf::UnknownField::TYPE_LENGTH_DELIMITED) continue;
    onnx::StringStringEntryProto e;
    if (e.ParseFromString(f.length_delimited())) out[e.key()] = e.value();
  }
  return out;
}

/// The signature's inputs: placeholder -> (kind, target).
struct Placeholder {
  std::string kind, target;
};
std::map<std::string, Placeholder> parseSignature(const std::string &text) {
  static const std::regex line(R"(^(\S+): ([A-Z_]+)(?: target='([^']*)')?)");
  std::map<std::string, Placeholder> out;
  std::istringstream in(text);
  std::string l;
  while (std::getline(in, l)) {
    if (l.rfind("# outputs", 0) == 0) break;
    std::smatch m;
    if (std::regex_search(l, m, line) && m[3].matched) out[m[1]] = {m[2], m[3]};
  }
  return out;
}

/// The `%name` tokens of an FX node's arguments (its own name excluded).
std::vector<std::string> fxArguments(const std::string &fx) {
  static const std::regex token(R"(%([A-Za-z0-9_]+))");
  std::vector<std::string> out;
  const auto args = fx.find("](args = ");
  if (args == std::string::npos) return out;
  for (std::sregex_iterator it(fx.begin() + long(args), fx.end(), token), end; it != end; ++it)
    out.push_back((*it)[1]);
  return out;
}

std::string leafName(const std::string &target) { return target.substr(target.rfind('.') + 1); }

/// The module path of a node from its `pkg.torch.onnx.name_scopes` (`['', 'model', 'model.embed', 'embedding']`).
std::string moduleOf(const std::string &scopes) {
  static const std::regex quoted(R"('([^']*)')");
  std::vector<std::string> parts;
  for (std::sregex_iterator it(scopes.begin(), scopes.end(), quoted), end; it != end; ++it) parts.push_back((*it)[1]);
  return parts.size() >= 2 ? parts[parts.size() - 2] : "";
}

/// The name of the FX node an FX node's text defines (`%layer_norm_1 : ...` -> `layer_norm_1`).
std::string fxName(const std::string &fx) {
  static const std::regex name(R"(^%([A-Za-z0-9_]+) :)");
  std::smatch m;
  return std::regex_search(fx, m, name) ? std::string(m[1]) : "";
}

/// The op an FX node name comes from: FX names a node after its target and numbers repeats (`layer_norm_1`).
std::string fxOp(const std::string &name) {
  static const std::regex numbered(R"(^(.*)_[0-9]+$)");
  std::smatch m;
  return std::regex_match(name, m, numbered) ? std::string(m[1]) : name;
}

/// `text` with every whole `%from` token replaced by `%to`.
std::string renameFxToken(const std::string &text, const std::string &from, const std::string &to) {
  return std::regex_replace(text, std::regex("%" + from + "(?![A-Za-z0-9_])"), "%" + to);
}

/// Sets the metadata entry `key` of node `n` (kept as unknown fields, as metadata() reads them).
void setNodeMetadata(onnx::NodeProto &n, const std::string &key, const std::string &value) {
  auto entries = metadata(n, kNodeMetadataField);
  entries[key] = value;
  auto *unknown = n.mutable_unknown_fields();
  unknown->DeleteByNumber(kNodeMetadataField);
  for (const auto &[k, v] : entries) {
    onnx::StringStringEntryProto e;
    e.set_key(k);
    e.set_value(v);
    unknown->AddLengthDelimited(kNodeMetadataField, e.SerializeAsString());
  }
}

/// How many leading dotted components two module paths share.
size_t commonPrefix(const std::string &a, const std::string &b) {
  size_t shared = 0, i = 0;
  for (; i < a.size() && i < b.size() && a[i] == b[i]; ++i)
    if (a[i] == '.') ++shared;
  const bool whole = (i == a.size() || a[i] == '.') && (i == b.size() || b[i] == '.');
  return shared + (whole && i > 0 ? 1 : 0);
}

bool isFloatTensor(const onnx::TensorProto &t) {
  auto dt = dtypeFromOnnx(t.data_type());
  return dt && ir::isFloating(*dt);
}

Expected<ir::Tensor> contents(const onnx::TensorProto &t, const std::string &dir, const std::string &where) {
  return t.data_location() == onnx::TensorProto::EXTERNAL ? readExternal(t, dir, where) : tensorFromOnnx(t, where);
}

/// The 2-D transpose of `t`.
ir::Tensor transposed(const ir::Tensor &t) {
  ir::Tensor out{t.dtype, {t.dims[1], t.dims[0]}, std::string(t.data.size(), '\0')};
  const size_t es = size_t(ir::dtypeSize(t.dtype));
  const int64_t rows = t.dims[0], cols = t.dims[1];
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) out.data.replace(size_t(j * rows + i) * es, es, t.data, size_t(i * cols + j) * es, es);
  return out;
}

bool sameTensor(const ir::Tensor &a, const ir::Tensor &b) {
  return a.dtype == b.dtype && a.dims == b.dims && a.data == b.data;
}

/// An FX node's `aten.embedding` padding_idx (its third argument), or -1
/// (none, or not an embedding) (Note [embedding padding row]).
int64_t embeddingPadding(const std::string &fx) {
  static const std::regex embedding(
      R"(target=torch\.ops\.aten\.embedding\.default\]\(args = \(%[A-Za-z0-9_]+, %[A-Za-z0-9_]+, (-?[0-9]+))");
  std::smatch m;
  return std::regex_search(fx, m, embedding) ? std::stoll(m[1]) : -1;
}

/// The FX node's batch-norm `momentum` argument when it is training-mode batch norm, else a negative number.
double trainingBatchNormMomentum(const std::string &fx) {
  static const std::regex bn(R"(_native_batch_norm_legit(?:_functional)?\.default\]\(args = \(.*, True, ([0-9.e+-]+), [0-9.e+-]+\))");
  std::smatch m;
  if (!std::regex_search(fx, m, bn)) return -1;
  return std::stod(m[1]);
}

/// The rewriter; one per model.
class Restorer {
public:
  Restorer(onnx::ModelProto &model, std::string dir, std::string where, ImportAudit &audit)
      : g_(*model.mutable_graph()), dir_(std::move(dir)), where_(std::move(where)), audit_(audit) {}

  Expected<ExportSignature> run(const std::map<std::string, Placeholder> &placeholders) {
    if (Status st = requireDynamicBatch(); !st) return Error{st.message()};
    ExportSignature sig;
    sig.present = true;
    std::map<std::string, std::string> param_of; // placeholder -> parameter target
    for (const auto &[ph, p] : placeholders) {
      if (p.kind == "PARAMETER") param_of[ph] = p.target, sig.parameters.insert(p.target);
      if (p.kind == "BUFFER") sig.buffers.insert(p.target);
    }
    for (int i = 0; i < g_.initializer_size(); ++i) init_[g_.initializer(i).name()] = i;
    unmergeComputations(param_of);
    // Each node's parameters by its FX node.
    std::vector<std::vector<std::string>> node_params(size_t(g_.node_size()));
    std::set<std::string> mentioned;
    fx_.resize(size_t(g_.node_size()));
    std::vector<std::string> module(size_t(g_.node_size()));
    std::vector<std::string> fused_bn; // Note [fused training BatchNorm]
    std::vector<std::string> padded;   // Note [embedding padding row]
    for (int n = 0; n < g_.node_size(); ++n) {
      auto meta = metadata(g_.node(n), kNodeMetadataField);
      const std::string &fx = fx_[size_t(n)] = meta["pkg.torch.onnx.fx_node"];
      module[size_t(n)] = moduleOf(meta["pkg.torch.onnx.name_scopes"]);
      if (meta["pkg.onnxscript.rewriter.rule_name"].find("FuseBatchNormIntoConv") != std::string::npos &&
          trainingBatchNormMomentum(fx) >= 0)
        fused_bn.push_back("'" + g_.node(n).name() + "' (module '" + module[size_t(n)] + "')");
      for (const auto &a : fxArguments(fx))
        if (auto it = param_of.find(a); it != param_of.end()) {
          node_params[size_t(n)].push_back(it->second);
          mentioned.insert(it->second);
        }
      if (double momentum = trainingBatchNormMomentum(fx); momentum >= 0) restoreTrainingBatchNorm(n, momentum);
      if (const int64_t pad = embeddingPadding(fx); pad >= 0 && g_.node(n).op_type() == "Gather" &&
                                                   g_.node(n).output_size() == 1) {
        sig.embedding_padding[g_.node(n).output(0)] = pad;
        padded.push_back(g_.node(n).name() + " (row " + std::to_string(pad) + " of " +
                         (node_params[size_t(n)].empty() ? std::string("its table") : node_params[size_t(n)][0]) + ")");
      }
    }
    if (!padded.empty())
      audit_.add(AuditAction::Fixed, "embedding padding row",
                 "an embedding's padding_idx row, which PyTorch never trains; the exported Gather would train it: "
                 "kept untrained, as PyTorch does",
                 padded);
    splitMerged(node_params);
    restoreZeroBiases(node_params); // before retie, which moves the nodes
    if (Status st = retie(node_params, sig); !st) return Error{st.message()};
    std::vector<std::string> folded, unread;
    for (const auto &[ph, target] : param_of) {
      if (init_.count(target)) continue;
      (mentioned.count(target) ? folded : unread).push_back(target);
    }
    if (!folded.empty()) {
      const std::string reason = fused_bn.empty() ? std::string(kFoldedReason) : fusedBatchNormReason(fused_bn);
      audit_.add(AuditAction::Refused, "folded parameter", reason, folded);
      return Error{where_ + ": " + folded.front() + (folded.size() > 1 ? " and others" : "") + ": " + reason};
    }
    // A parameter no surviving node names is tied to another when its own
    // module (or a submodule) still runs and reads a parameter of the same
    // leaf name (the embedding reading the head's tied weight, BERT's
    // prediction head reading its decoder's bias); otherwise its use was
    // folded away: a table looked up at fixed positions.
    std::vector<std::string> lookups;
    for (const auto &p : unread) {
      const std::string own = p.substr(0, p.rfind('.'));
      bool tied = false;
      for (size_t n = 0; n < module.size() && !tied; ++n) // original node order, as node_params
        if (module[n] == own || module[n].rfind(own + ".", 0) == 0)
          for (const auto &q : node_params[n]) tied = tied || (q != p && leafName(q) == leafName(p));
      if (!tied) lookups.push_back(p);
    }
    if (!lookups.empty()) {
      if (std::string why = foldedFunction(lookups, sig); !why.empty()) {
        audit_.add(AuditAction::Refused, "folded parameter", why, lookups);
        return Error{where_ + ": " + lookups.front() + (lookups.size() > 1 ? " and others" : "") + ": " + why};
      }
      const std::string reason = std::string(kLookupReason) + (dynamicSequence() ? "; " : kFixedSequenceHint) +
                                 "export with torch.onnx.export(..., optimize=False)";
      audit_.add(AuditAction::Refused, "folded parameter", reason, lookups);
      return Error{where_ + ": " + lookups.front() + (lookups.size() > 1 ? " and others" : "") + ": " + reason};
    }
    if (!unread.empty())
      audit_.add(AuditAction::Warning, "tied parameter",
                 "tied to another parameter, which their module reads: trained once, as in PyTorch",
                 unread);
    for (auto it = sig.parameters.begin(); it != sig.parameters.end();)
      it = init_.count(*it) ? std::next(it) : sig.parameters.erase(it);
    std::vector<std::string> constants, buffers;
    for (const auto &t : g_.initializer())
      if (isFloatTensor(t) && !sig.parameters.count(t.name()))
        (sig.buffers.count(t.name()) ? buffers : constants).push_back(t.name());
    if (!constants.empty())
      audit_.add(AuditAction::Fixed, "folded constant",
                 "not a parameter of the PyTorch model (the exporter computed it from constants): kept constant",
                 constants);
    if (!buffers.empty())
      audit_.add(AuditAction::Fixed, "buffer",
                 "a PyTorch buffer: not trained (BatchNorm statistics updated in training, others constant)",
                 buffers);
    return sig;
  }

private:
  // Note [fused training BatchNorm]
  // What a default dynamo export of a BatchNorm CNN in train() mode keeps
  // (torch 2.14, onnxscript's optimizer; measured on torchvision's
  // ResNet-18 and MobileNet v3): each fused Conv's metadata names its
  // origin, `pkg.torch.onnx.fx_node` the FX node
  // `aten._native_batch_norm_legit_functional(conv, p_bn_weight, p_bn_bias,
  // b_bn_running_mean, b_bn_running_var, True, 0.1, 1e-05)` (training, its
  // momentum and eps, the names of gamma, beta and the statistics) and
  // `pkg.onnxscript.rewriter.rule_name` `FuseBatchNormIntoConv`. The values
  // are gone: the Conv's weight is W gamma / sqrt(var + eps) and its bias
  // beta - mean gamma / sqrt(var + eps) (dropped when zero, as at
  // initialisation); no initializer, function or model property holds W,
  // gamma, beta or the statistics (the external data holds exactly the
  // remaining initializers). Per channel one product stands for W, gamma
  // and var, so no importer can rebuild the training-mode BatchNorm
  // exactly: at PyTorch's initial values (gamma 1, var 1) one could guess
  // W = W' sqrt(1 + eps), but a model with other values (pretrained,
  // zero-initialised residual gammas, whose W the product erases) would
  // silently train another model. So the import refuses, naming the fused
  // nodes and the exports that keep BatchNorm.
  static std::string fusedBatchNormReason(const std::vector<std::string> &nodes) {
    return "torch.onnx.export's optimizer (optimize=True, the default) folded " + std::to_string(nodes.size()) +
           " training-mode BatchNorm(s) into the convolution before each (first: node " + nodes.front() +
           ", whose metadata records aten._native_batch_norm_legit_functional with training=True and the "
           "rewrite FuseBatchNormIntoConv): onnxscript writes BatchNorm for inference and the file keeps only "
           "each convolution's weight times gamma / sqrt(running_var + eps), not the weight, gamma, beta or "
           "the running statistics, so training-mode BatchNorm cannot be rebuilt; save torch.export.export's "
           "program with torch.export.save instead, or export with torch.onnx.export(..., optimize=False)";
  }
  static constexpr const char *kFoldedReason =
      "torch.onnx.export's optimizer (optimize=True, the default) folded these parameters into other weights "
      "(a BatchNorm: onnxscript writes it for inference, and the optimizer multiplies its weight, bias and running "
      "statistics into the convolution before it; the file no longer holds them, so no importer can separate and "
      "train them); save torch.export.export's program with torch.export.save instead, or export with "
      "torch.onnx.export(..., "
      "optimize=False)";
  // Note [unread parameters]: no node of the optimized graph reads these
  // parameters, and rannc cannot say which computation the optimizer took:
  // a table looked up at fixed positions (a position embedding at a fixed
  // sequence length, Swin's relative position bias), or a function of the
  // parameter folded with a constant into a constant (Gemma's RMSNorm scales
  // by 1 + weight: the file keeps `add_173` = 1 + weight, but neither the
  // weight nor the 1, so the weight cannot be recovered; foldedFunction names
  // the folded op). A computation merged into an equal one of another module
  // is restored before (Note [merged computations]).
  static constexpr const char *kLookupReason =
      "torch.onnx.export's optimizer (optimize=True, the default) folded every computation that reads these "
      "parameters into a constant or merged it into another module's equal one (a table looked up at fixed "
      "positions, a function of the parameter such as Gemma's 1 + weight), so they cannot be trained";
  static constexpr const char *kFixedSequenceHint =
      "; for a lookup at fixed positions make the sequence dimension dynamic too (dynamic_shapes={name: {0: batch, "
      "1: seq}}), or ";

  /// Why `params` cannot be restored when their module reads, where its FX
  /// node reads an arithmetic op's result (`%add_407`), a folded constant
  /// that result became (`add_173`, named after the same op): a function of
  /// the parameter, such as Gemma's RMSNorm scale `1 + weight`, folded with
  /// its other operand. Empty when no such read explains them.
  std::string foldedFunction(const std::vector<std::string> &params, const ExportSignature &sig) const {
    // Elementwise arithmetic of the parameter and another operand; a lookup
    // (index, view, unsqueeze of a table) keeps the general reason and its hint.
    static const std::set<std::string> kArithmetic = {"add", "sub", "rsub", "mul", "div"};
    std::set<std::string> computed;
    for (const auto &n : g_.node())
      for (const auto &o : n.output()) computed.insert(o);
    std::vector<std::string> seen;
    for (const auto &p : params) {
      const std::string own = p.substr(0, p.rfind('.'));
      for (int n = 0; n < g_.node_size() && seen.size() < 2; ++n) {
        auto meta = metadata(g_.node(n), kNodeMetadataField);
        if (moduleOf(meta["pkg.torch.onnx.name_scopes"]) != own) continue;
        const auto args = fxArguments(meta["pkg.torch.onnx.fx_node"]);
        for (const auto &c : g_.node(n).input()) {
          if (!init_.count(c) || sig.parameters.count(c) || sig.buffers.count(c)) continue;
          for (const auto &x : args)
            if (!computed.count(x) && fxOp(x) == fxOp(c) && kArithmetic.count(fxOp(x))) {
              const std::string s = p + ": PyTorch's %" + x + " (aten " + fxOp(x) + " of the parameter) is the constant " + c;
              if (std::find(seen.begin(), seen.end(), s) == seen.end()) seen.push_back(s);
            }
        }
      }
    }
    if (seen.empty()) return "";
    std::string out = "torch.onnx.export's optimizer (optimize=True, the default) folded a function of these parameters "
                      "into constants (";
    for (size_t i = 0; i < seen.size(); ++i) out += (i ? "; " : "") + seen[i];
    return out + "): the file holds neither the parameter nor the function's other operand, so the parameter cannot "
                 "be recovered or trained; save torch.export.export's program with torch.export.save instead, or "
                 "export with torch.onnx.export(..., optimize=False)";
  }

  /// True when some graph input's dimension 1 is symbolic (a dynamic sequence).
  bool dynamicSequence() const {
    for (const auto &in : g_.input()) {
      const auto &shape = in.type().tensor_type().shape();
      if (!init_.count(in.name()) && shape.dim_size() > 1 && !shape.dim(1).has_dim_value()) return true;
    }
    return false;
  }

  /// torch.export bakes a fixed batch size into every reshape, so the graph
  /// runs at that size only, while rannc splits the batch into micro-batches.
  Status requireDynamicBatch() {
    std::set<std::string> inits;
    for (const auto &t : g_.initializer()) inits.insert(t.name());
    std::vector<std::string> fixed;
    for (const auto &in : g_.input()) {
      const auto &shape = in.type().tensor_type().shape();
      if (inits.count(in.name()) || !in.type().tensor_type().has_shape() || shape.dim_size() == 0) continue;
      if (shape.dim(0).has_dim_value())
        fixed.push_back(in.name() + " (" + std::to_string(shape.dim(0).dim_value()) + ")");
    }
    if (fixed.empty()) return Status::success();
    const std::string reason =
        "exported with a fixed batch dimension, which the graph's reshapes bake in, while rannc splits the batch "
        "into micro-batches; export with a dynamic one: torch.onnx.export(..., dynamic_shapes={name: {0: "
        "torch.export.Dim(\"batch\")} for each input})";
    audit_.add(AuditAction::Refused, "fixed batch dimension", reason, fixed);
    return Error{where_ + ": input " + fixed.front() + ": " + reason};
  }

  // Note [merged computations]: the optimizer's common-subexpression
  // elimination merges two nodes whose inputs are the same values. Once it
  // has merged parameters of equal contents (Note [export signature]), two
  // modules applied to one input become one: GPT-NeoX's parallel residual
  // normalises one hidden state with two LayerNorms, both starting at ones
  // and zeros, and the file keeps one LayerNormalization that both the
  // attention and the MLP read. The readers' FX nodes still name the value
  // they read in PyTorch (`linear_2` reads `%layer_norm_1`), a value no node
  // of the file computes, of the same op as the one it reads (`layer_norm`).
  // That computation runs again: a copy of the surviving FX node's nodes that
  // reads, in place of each of its parameters, the parameter of the same leaf
  // name of one module nothing reads (the module nearest the reader; a tie is
  // left to the refusal), each starting at the survivor's contents: the merge
  // happened because they were equal. splitMerged then gives the copy its own
  // initializers.
  void unmergeComputations(const std::map<std::string, std::string> &param_of) {
    std::map<std::string, std::string> ph_of; // parameter target -> placeholder
    for (const auto &[ph, target] : param_of) ph_of[target] = ph;
    std::set<std::string> produced, mentioned;
    for (const auto &in : g_.input()) produced.insert(in.name());
    for (const auto &[name, i] : init_) produced.insert(name);
    std::vector<std::string> fx(size_t(g_.node_size())), name(fx.size());
    std::map<std::string, int> producer;
    for (int n = 0; n < g_.node_size(); ++n) {
      fx[size_t(n)] = metadata(g_.node(n), kNodeMetadataField)["pkg.torch.onnx.fx_node"];
      name[size_t(n)] = fxName(fx[size_t(n)]);
      for (const auto &o : g_.node(n).output()) produced.insert(o), producer[o] = n;
      for (const auto &a : fxArguments(fx[size_t(n)]))
        if (auto it = param_of.find(a); it != param_of.end()) mentioned.insert(it->second);
    }
    std::map<std::string, std::vector<std::string>> unread; // module -> its parameters nothing reads
    for (const auto &[ph, target] : param_of)
      if (!mentioned.count(target)) unread[target.substr(0, target.rfind('.'))].push_back(target);
    struct Copy {
      std::string survivor, module;         // the FX value read, the module whose parameters the copy reads
      std::map<std::string, std::string> with; // survivor's placeholder -> the copy's
    };
    std::map<std::string, Copy> copies;                      // merged-away FX value -> its copy
    std::vector<std::tuple<int, int, std::string>> redirect; // (node, input, merged-away value)
    for (int n = 0; n < g_.node_size(); ++n) {
      const auto args = fxArguments(fx[size_t(n)]);
      for (int k = 0; k < g_.node(n).input_size(); ++k) {
        const std::string &y = g_.node(n).input(k);
        auto p = producer.find(y);
        if (p == producer.end() || name[size_t(p->second)] != y || std::count(args.begin(), args.end(), y)) continue;
        std::vector<std::string> gone;
        for (const auto &a : args)
          if (!produced.count(a) && !param_of.count(a) && a != y && fxOp(a) == fxOp(y)) gone.push_back(a);
        if (gone.size() != 1) continue;
        const std::string &x = gone.front();
        if (!copies.count(x)) {
          std::vector<std::string> own; // the survivor's parameters
          for (const auto &a : fxArguments(fx[size_t(p->second)]))
            if (auto it = param_of.find(a); it != param_of.end()) own.push_back(it->second);
          const std::string reader = moduleOf(metadata(g_.node(n), kNodeMetadataField)["pkg.torch.onnx.name_scopes"]);
          std::string best;
          size_t best_score = 0, ties = 0;
          for (const auto &[module, params] : unread) {
            bool fits = !own.empty();
            for (const auto &q : own)
              fits = fits && std::count_if(params.begin(), params.end(),
                                           [&](const std::string &r) { return leafName(r) == leafName(q); }) == 1;
            bool taken = false;
            for (const auto &[v, c] : copies) taken = taken || c.module == module;
            if (!fits || taken) continue;
            const size_t score = commonPrefix(module, reader);
            if (score > best_score || best.empty()) best = module, best_score = score, ties = 0;
            else if (score == best_score) ++ties;
          }
          if (best.empty() || ties) continue;
          Copy c{y, best, {}};
          for (const auto &q : own) c.with[ph_of.at(q)] = ph_of.at(best + "." + leafName(q));
          copies[x] = std::move(c);
        }
        if (copies.at(x).survivor == y) redirect.emplace_back(n, k, x);
      }
    }
    if (copies.empty()) return;
    for (const auto &[n, k, x] : redirect) g_.mutable_node(n)->set_input(k, x);
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    std::vector<std::string> names;
    for (int n = 0; n < g_.node_size(); ++n) {
      *nodes.Add() = g_.node(n);
      const bool last = n + 1 == g_.node_size() || name[size_t(n + 1)] != name[size_t(n)];
      for (const auto &[x, c] : copies) {
        if (!last || name[size_t(n)] != c.survivor) continue;
        int first = n;
        while (first > 0 && name[size_t(first - 1)] == c.survivor) --first;
        auto rename = [&](const std::string &v) { return v == c.survivor ? x : v + "_" + x; };
        std::set<std::string> inner;
        for (int m = first; m <= n; ++m)
          for (const auto &o : g_.node(m).output()) inner.insert(o);
        for (int m = first; m <= n; ++m) {
          onnx::NodeProto copy = g_.node(m);
          copy.set_name(copy.name() + "_" + x);
          for (int i = 0; i < copy.input_size(); ++i)
            if (inner.count(copy.input(i))) copy.set_input(i, rename(copy.input(i)));
          for (int i = 0; i < copy.output_size(); ++i) copy.set_output(i, rename(copy.output(i)));
          auto meta = metadata(copy, kNodeMetadataField);
          std::string text = renameFxToken(fx[size_t(m)], c.survivor, x);
          for (const auto &[from, to] : c.with) text = renameFxToken(text, from, to);
          setNodeMetadata(copy, "pkg.torch.onnx.fx_node", text);
          const std::string scopes = meta["pkg.torch.onnx.name_scopes"], was = moduleOf(scopes);
          if (!was.empty()) // the copy runs in the module whose parameters it reads
            setNodeMetadata(copy, "pkg.torch.onnx.name_scopes",
                            std::regex_replace(scopes, std::regex("'" + std::regex_replace(was, std::regex(R"([.])"), R"(\.)") + "'"),
                                               "'" + c.module + "'"));
          *nodes.Add() = std::move(copy);
        }
        names.push_back(x + " (" + c.module + ", merged into " + c.survivor + ")");
      }
    }
    g_.mutable_node()->Swap(&nodes);
    audit_.add(AuditAction::Fixed, "merged computation",
               "the exporter merged a module's computation into an equal one of another module (their parameters "
               "started equal); it runs again on its own parameters",
               names);
  }

  /// Node inputs that read a parameter merged into another of the same leaf name read a copy under their own name.
  void splitMerged(const std::vector<std::vector<std::string>> &node_params) {
    for (int n = 0; n < g_.node_size(); ++n) {
      const auto &named = node_params[size_t(n)];
      if (named.empty()) continue;
      auto *node = g_.mutable_node(n);
      for (int i = 0; i < node->input_size(); ++i) {
        const std::string in = node->input(i);
        if (!init_.count(in) || std::find(named.begin(), named.end(), in) != named.end()) continue;
        std::vector<std::string> candidates;
        for (const auto &p : named)
          if (!init_.count(p) && leafName(p) == leafName(in) &&
              std::find(candidates.begin(), candidates.end(), p) == candidates.end())
            candidates.push_back(p);
        if (candidates.size() != 1) continue;
        const std::string &own = candidates.front();
        onnx::TensorProto copy = g_.initializer(init_.at(in));
        copy.set_name(own);
        init_[own] = g_.initializer_size();
        *g_.add_initializer() = std::move(copy);
        for (int k = 0; k < node->input_size(); ++k)
          if (node->input(k) == in) node->set_input(k, own);
        audit_.add(AuditAction::Fixed, "merged parameter",
                   "the exporter merged parameters with equal starting values; each is its own parameter again",
                   {own + " (was " + in + ")"});
      }
    }
  }

  /// How input `k` of node `n` holds the weight of the one parameter its FX
  /// node names: 1 transposed (a MatMul of aten.linear, a Gemm without
  /// transB), 0 as is (a Gemm with transB), -1 unknown.
  int weightLayout(int n, int k) const {
    const auto &node = g_.node(n);
    if (k != 1) return -1;
    if (node.op_type() == "MatMul")
      return fx_[size_t(n)].find("target=torch.ops.aten.linear.default]") != std::string::npos ? 1 : -1;
    if (node.op_type() != "Gemm") return -1;
    for (const auto &a : node.attribute())
      if (a.name() == "transB") return a.i() ? 0 : 1;
    return 1;
  }

  // Note [folded weight transposes]: a module that multiplies by its
  // weight's transpose itself (Falcon's FalconLinear: `x @ self.weight.T`)
  // reaches the file as aten.matmul(x, %permute_3), and the optimizer folds
  // the permute of the parameter into a constant named after it
  // (`permute_3`), dropping the weight: no surviving FX node names the
  // parameter. The MatMul's module still says whose it is: when its second
  // input is that constant (the initializer's name is the FX argument's, a
  // value no node computes, of a transposing op) and the module's `weight`
  // is a parameter the file lacks, that weight is the constant's transpose.
  /// The parameter whose transpose input `k` of MatMul `n` is, as above; empty when none.
  std::string transposedWeightOf(int n, int k, const ExportSignature &sig) const {
    static const std::set<std::string> kTransposing = {"permute", "t", "transpose", "numpy_T"};
    const auto &node = g_.node(n);
    if (node.op_type() != "MatMul" || k != 1) return "";
    const std::string &in = node.input(k);
    const auto args = fxArguments(fx_[size_t(n)]);
    // `in` is an initializer (retie's loop), so no node computes it.
    if (std::find(args.begin(), args.end(), in) == args.end() || !kTransposing.count(fxOp(in))) return "";
    auto meta = metadata(node, kNodeMetadataField);
    const std::string weight = moduleOf(meta["pkg.torch.onnx.name_scopes"]) + ".weight";
    return sig.parameters.count(weight) && !init_.count(weight) ? weight : "";
  }

  /// Folded weights become an op on their parameter again: equal to a
  /// present parameter's transpose or copy, or, when the parameter itself
  /// was folded away, the parameter restored from them (the Linear's weight
  /// its MatMul reads transposed).
  Status retie(const std::vector<std::vector<std::string>> &node_params, const ExportSignature &sig) {
    std::map<std::string, ir::Tensor> cache, restored;
    auto load = [&](const std::string &name) -> const ir::Tensor * {
      if (auto it = restored.find(name); it != restored.end()) return &it->second;
      if (auto it = cache.find(name); it != cache.end()) return &it->second;
      if (!init_.count(name)) return nullptr;
      auto t = contents(g_.initializer(init_.at(name)), dir_, where_);
      if (!t) return nullptr;
      return &cache.emplace(name, std::move(*t)).first->second;
    };
    std::map<std::string, std::pair<std::string, bool>> tie; // folded -> (parameter, transposed)
    for (int n = 0; n < g_.node_size(); ++n)
      for (int k = 0; k < g_.node(n).input_size(); ++k) {
        const std::string &in = g_.node(n).input(k);
        if (!init_.count(in) || sig.parameters.count(in) || sig.buffers.count(in) || tie.count(in)) continue;
        const auto &t = g_.initializer(init_.at(in));
        if (!isFloatTensor(t) || t.dims_size() != 2) continue;
        const ir::Tensor *c = load(in);
        if (!c) continue;
        std::vector<std::string> missing;
        for (const auto &p : node_params[size_t(n)]) {
          const ir::Tensor *w = load(p);
          if (!w) {
            if (leafName(p) == "weight") missing.push_back(p);
            continue;
          }
          if (w->dims.size() == 2 && sameTensor(*c, transposed(*w))) tie[in] = {p, true};
          else if (sameTensor(*c, *w)) tie[in] = {p, false};
          if (tie.count(in)) break;
        }
        int layout = weightLayout(n, k);
        if (!tie.count(in) && missing.empty() && layout < 0)
          if (std::string w = transposedWeightOf(n, k, sig); !w.empty()) missing = {w}, layout = 1;
        if (tie.count(in) || missing.size() != 1 || layout < 0) continue;
        restored[missing.front()] = layout ? transposed(*c) : *c;
        tie[in] = {missing.front(), layout == 1};
      }
    if (tie.empty()) return Status::success();
    // Replace each tied initializer by a Transpose/Identity node at the
    // graph's start; a restored parameter's contents are held inline.
    google::protobuf::RepeatedPtrField<onnx::TensorProto> kept;
    std::map<std::string, int32_t> onnx_type;
    for (auto &t : *g_.mutable_initializer()) {
      onnx_type[t.name()] = t.data_type();
      if (!tie.count(t.name())) *kept.Add() = std::move(t);
    }
    for (const auto &[folded, how] : tie) {
      auto it = restored.find(how.first);
      if (it == restored.end()) continue;
      auto *p = kept.Add();
      p->set_name(how.first);
      p->set_data_type(onnx_type.at(folded));
      for (int64_t d : it->second.dims) p->add_dims(d);
      p->set_raw_data(it->second.data);
      restored.erase(it);
    }
    g_.mutable_initializer()->Swap(&kept);
    google::protobuf::RepeatedPtrField<onnx::NodeProto> nodes;
    std::vector<std::string> names;
    for (const auto &[folded, how] : tie) {
      auto *n = nodes.Add();
      n->set_name(folded + "_retied");
      n->set_op_type(how.second ? "Transpose" : "Identity");
      n->add_input(how.first);
      n->add_output(folded);
      if (how.second) {
        auto *perm = n->add_attribute();
        perm->set_name("perm");
        perm->set_type(onnx::AttributeProto::INTS);
        perm->add_ints(1);
        perm->add_ints(0);
      }
      names.push_back(folded + " = " + (how.second ? "transpose of " : "copy of ") + how.first);
    }
    for (auto &n : *g_.mutable_node()) *nodes.Add() = std::move(n);
    g_.mutable_node()->Swap(&nodes);
    init_.clear();
    for (int i = 0; i < g_.initializer_size(); ++i) init_[g_.initializer(i).name()] = i;
    audit_.add(AuditAction::Fixed, "re-tied weight",
               "the exporter folded a parameter (or its transpose) into a new weight; the graph reads the "
               "parameter again, trained once",
               names);
    return Status::success();
  }

  /// The shape of the initializer `name`; empty when it is none.
  std::vector<int64_t> matrixShape(const std::string &name) const {
    auto it = init_.find(name);
    if (it == init_.end()) return {};
    const auto &t = g_.initializer(it->second);
    return {t.dims().begin(), t.dims().end()};
  }

  /// A Gemm of aten.linear or aten.addmm (GPT-2's Conv1D), or a Conv, whose bias the optimizer dropped (it
  /// does so when the bias is all zeros, as torchvision's classifiers and
  /// ConvNeXt's convolutions start) reads a zero parameter of the bias's name again.
  void restoreZeroBiases(const std::vector<std::vector<std::string>> &node_params) {
    std::vector<std::string> names;
    for (int n = 0; n < g_.node_size(); ++n) {
      auto *node = g_.mutable_node(n);
      const bool gemm = node->op_type() == "Gemm" &&
                        (fx_[size_t(n)].find("target=torch.ops.aten.linear.default]") != std::string::npos ||
                         fx_[size_t(n)].find("target=torch.ops.aten.addmm.default]") != std::string::npos);
      const bool conv = node->op_type() == "Conv" && fx_[size_t(n)].find("target=torch.ops.aten.conv") != std::string::npos;
      if (!(gemm || conv) || node->input_size() != 2) continue;
      std::vector<std::string> missing;
      for (const auto &p : node_params[size_t(n)])
        if (!init_.count(p) && leafName(p) == "bias") missing.push_back(p);
      const auto b = matrixShape(node->input(1));
      if (missing.size() != 1 || b.size() < 2 || (gemm && b.size() != 2)) continue;
      bool trans_b = false;
      for (const auto &a : node->attribute())
        if (a.name() == "transB") trans_b = a.i() != 0;
      const int64_t out = conv || trans_b ? b[0] : b[1]; // a Conv's weight is [out, in/groups, k...]
      auto *t = g_.add_initializer();
      t->set_name(missing.front());
      t->set_data_type(onnx::TensorProto::FLOAT);
      t->add_dims(out);
      t->set_raw_data(std::string(size_t(out) * sizeof(float), '\0'));
      init_[missing.front()] = g_.initializer_size() - 1;
      node->add_input(missing.front());
      names.push_back(missing.front());
    }
    if (!names.empty())
      audit_.add(AuditAction::Fixed, "dropped zero bias",
                 "the exporter dropped a bias that starts at zero; it is a zero parameter again", names);
  }

  /// An inference-mode BatchNormalization that PyTorch ran in training mode runs in training mode again.
  void restoreTrainingBatchNorm(int n, double momentum) {
    auto *node = g_.mutable_node(n);
    if (node->op_type() != "BatchNormalization" || node->input_size() != 5) return;
    bool training = false;
    for (const auto &a : node->attribute())
      if (a.name() == "training_mode") training = a.i() != 0;
    if (training) return;
    google::protobuf::RepeatedPtrField<onnx::AttributeProto> attrs;
    for (auto &a : *node->mutable_attribute())
      if (a.name() != "training_mode" && a.name() != "momentum") *attrs.Add() = std::move(a);
    node->mutable_attribute()->Swap(&attrs);
    auto *mode = node->add_attribute();
    mode->set_name("training_mode");
    mode->set_type(onnx::AttributeProto::INT);
    mode->set_i(1);
    auto *m = node->add_attribute();
    m->set_name("momentum");
    m->set_type(onnx::AttributeProto::FLOAT);
    m->set_f(float(1.0 - momentum)); // ONNX keeps the old statistics' share, PyTorch the new one's
    while (node->output_size() < 3) node->add_output(node->name() + "_running_stat_" + std::to_string(node->output_size()));
    audit_.add(AuditAction::Fixed, "inference-mode BatchNorm",
               "the exporter wrote a training-mode BatchNorm for inference; it runs in training mode again, its "
               "running statistics updated as PyTorch updates them",
               {node->name()});
  }

  onnx::GraphProto &g_;
  std::string dir_, where_;
  ImportAudit &audit_;
  std::map<std::string, int> init_;
  std::vector<std::string> fx_; ///< each node's FX node
};

} // namespace

Expected<ExportSignature> restoreSignature(onnx::ModelProto &model, const std::string &dir, const std::string &where,
                                           ImportAudit *audit) {
  ImportAudit own;
  const auto meta = metadata(model.graph(), kGraphMetadataField);
  auto it = meta.find("pkg.torch.export.ExportedProgram.graph_signature");
  if (it == meta.end()) return ExportSignature{};
  return Restorer(model, dir, where, audit ? *audit : own).run(parseSignature(it->second));
}

} // namespace rannc::import
