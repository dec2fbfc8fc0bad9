#include "executor/runtime/conformance.h"

#include <onnx/onnx_pb.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>

#include "executor/runtime/interpreter.h"
#include "executor/runtime/ops.h"
#include "planner/import/onnx_import.h"

// Note [conformance scope]
// A case is SKIPPED only when it needs something rannc deliberately does not
// model: non-tensor values (sequences, optionals, maps), string, unsigned
// 16/32/64-bit or complex tensors (LibTorch has no such dtype), control flow
// with subgraphs, quantized ops, and ops of other domains (ai.onnx.ml, and
// ai.onnx.preview.training, whose optimizers rannc's trainer replaces). An op
// of the default domain that rannc simply lacks is a FAILURE naming the op.
// Outputs that depend on random numbers (Dropout in training mode, Random*,
// Bernoulli) are compared by dtype and shape (and Dropout by its structure:
// kept elements scaled by 1/(1-ratio), the others 0).

namespace rannc::runtime {
namespace {

namespace fs = std::filesystem;
using onnx::TensorProto;

/// Reason for skipping (empty: in scope).
struct Scope {
  std::string skip;
  void note(const std::string &why) {
    if (skip.empty()) skip = why;
  }
};

std::string elemTypeScope(int32_t t) {
  switch (t) {
  case TensorProto::STRING: return "string tensors";
  case TensorProto::UINT16:
  case TensorProto::UINT32:
  case TensorProto::UINT64: return "unsigned 16/32/64-bit tensors (no LibTorch dtype)";
  case TensorProto::COMPLEX64:
  case TensorProto::COMPLEX128: return "complex tensors";
  default: break;
  }
  if (!import::dtypeFromOnnx(t) && t != TensorProto::UNDEFINED)
    return "element type " + std::to_string(t) + " (no LibTorch dtype)";
  return "";
}

void scanType(const onnx::TypeProto &type, Scope &s) {
  switch (type.value_case()) {
  case onnx::TypeProto::kTensorType: {
    std::string why = elemTypeScope(type.tensor_type().elem_type());
    if (!why.empty()) s.note(why);
    break;
  }
  case onnx::TypeProto::kSequenceType: s.note("sequence types"); break;
  case onnx::TypeProto::kOptionalType: s.note("optional types"); break;
  case onnx::TypeProto::kMapType: s.note("map types"); break;
  case onnx::TypeProto::kSparseTensorType: s.note("sparse tensors"); break;
  default: break;
  }
}

const std::set<std::string> &controlFlowOps() {
  static const std::set<std::string> k = {"If", "Loop", "Scan"};
  return k;
}
const std::set<std::string> &sequenceOps() {
  static const std::set<std::string> k = {
      "ConcatFromSequence", "Optional",         "OptionalGetElement", "OptionalHasElement",
      "SequenceAt",         "SequenceConstruct", "SequenceEmpty",      "SequenceErase",
      "SequenceInsert",     "SequenceLength",    "SequenceMap",        "SplitToSequence"};
  return k;
}
const std::set<std::string> &quantizedOps() {
  static const std::set<std::string> k = {"ConvInteger",   "DequantizeLinear", "DynamicQuantizeLinear",
                                          "MatMulInteger", "QLinearConv",      "QLinearMatMul",
                                          "QuantizeLinear"};
  return k;
}
const std::set<std::string> &randomOps() {
  static const std::set<std::string> k = {"Bernoulli",     "Multinomial",   "RandomNormal",
                                          "RandomNormalLike", "RandomUniform", "RandomUniformLike"};
  return k;
}

Scope scopeOf(const onnx::ModelProto &model) {
  Scope s;
  const auto &g = model.graph();
  for (const auto &n : g.node()) {
    if (!n.domain().empty() && n.domain() != "ai.onnx") {
      if (n.domain() == "ai.onnx.preview.training")
        s.note("ai.onnx.preview.training ops (optimizers and Gradient; rannc's trainer owns these)");
      else
        s.note("op domain '" + n.domain() + "'");
    } else if (controlFlowOps().count(n.op_type())) {
      s.note("control flow with subgraphs (If/Loop/Scan)");
    } else if (sequenceOps().count(n.op_type())) {
      s.note("sequence and optional ops");
    } else if (quantizedOps().count(n.op_type())) {
      s.note("quantized ops");
    }
    for (const auto &a : n.attribute()) {
      using A = onnx::AttributeProto;
      if (a.type() == A::GRAPH || a.type() == A::GRAPHS)
        s.note("control flow with subgraphs (If/Loop/Scan)");
      else if (a.type() == A::SPARSE_TENSOR || a.type() == A::SPARSE_TENSORS)
        s.note("sparse tensors");
      else if (a.type() == A::TENSOR) {
        std::string why = elemTypeScope(a.t().data_type());
        if (!why.empty()) s.note(why);
      }
    }
  }
  for (const auto &vi : g.input()) scanType(vi.type(), s);
  for (const auto &vi : g.output()) scanType(vi.type(), s);
  for (const auto &vi : g.value_info()) scanType(vi.type(), s);
  for (const auto &t : g.initializer()) {
    std::string why = elemTypeScope(t.data_type());
    if (!why.empty()) s.note(why);
  }
  if (g.sparse_initializer_size() > 0) s.note("sparse tensors");
  return s;
}

/// A case failure or skip found while running it.
struct CaseStop {
  CaseOutcome outcome;
  std::string reason;
};
[[noreturn]] void failCase(const std::string &why) { throw CaseStop{CaseOutcome::Fail, why}; }

std::string readBytes(const fs::path &p) {
  std::ifstream in(p, std::ios::binary);
  if (!in) failCase("cannot read " + p.filename().string());
  return std::string(std::istreambuf_iterator<char>(in), {});
}

/// Reads a TensorProto file. `declared` is the graph's element type for it: old
/// test data stores bfloat16 tensors as uint16 bit patterns.
torch::Tensor readTensor(const fs::path &p, int32_t declared) {
  TensorProto proto;
  if (!proto.ParseFromString(readBytes(p)))
    failCase(p.parent_path().filename().string() + "/" + p.filename().string() +
             " is not a TensorProto (sequence or optional data?)");
  if (proto.data_type() == TensorProto::UINT16 && declared == TensorProto::BFLOAT16)
    proto.set_data_type(TensorProto::BFLOAT16);
  std::string why = elemTypeScope(proto.data_type());
  if (!why.empty()) throw CaseStop{CaseOutcome::Skip, why};
  auto t = import::tensorFromOnnx(proto, p.filename().string());
  if (!t) failCase(t.error().message);
  return toTorch(*t);
}

std::vector<fs::path> numberedFiles(const fs::path &dir, const std::string &prefix) {
  std::vector<fs::path> files;
  for (size_t i = 0;; ++i) {
    fs::path p = dir / (prefix + std::to_string(i) + ".pb");
    if (!fs::exists(p)) break;
    files.push_back(p);
  }
  return files;
}

std::string shapeText(c10::IntArrayRef s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

std::string valueText(const torch::Tensor &flat, int64_t i) {
  std::ostringstream os;
  if (flat.scalar_type() == torch::kBool)
    os << (flat[i].item<bool>() ? "true" : "false");
  else if (flat.is_floating_point())
    os << flat[i].item<double>();
  else
    os << flat[i].item<int64_t>();
  return os.str();
}

/// Empty when `got` matches `want`: same dtype and shape; floats within
/// |got - want| <= atol + rtol * |want| (NaN matches NaN, infinities must
/// agree), everything else exactly.
std::string compareOutput(size_t index, const torch::Tensor &got_in, const torch::Tensor &want) {
  std::string what = "output " + std::to_string(index);
  if (!got_in.defined()) return what + " was not computed";
  torch::Tensor got = got_in.detach().to(torch::kCPU);
  if (got.scalar_type() != want.scalar_type())
    return what + " has type " + c10::toString(got.scalar_type()) + ", expected " +
           c10::toString(want.scalar_type());
  if (got.sizes() != want.sizes())
    return what + " has shape " + shapeText(got.sizes()) + ", expected " + shapeText(want.sizes());
  torch::Tensor g = got.reshape({-1}), w = want.reshape({-1});
  torch::Tensor bad;
  if (want.is_floating_point()) {
    // Tolerances: rtol 1e-3, atol 1e-5; 16-bit floats carry fewer digits.
    double rtol = 1e-3, atol = 1e-5;
    if (want.scalar_type() == torch::kHalf) rtol = 4e-3, atol = 1e-3;
    if (want.scalar_type() == torch::kBFloat16) rtol = 2e-2, atol = 1e-2;
    torch::Tensor gd = g.to(torch::kDouble), wd = w.to(torch::kDouble);
    torch::Tensor close = (gd - wd).abs() <= atol + rtol * wd.abs();
    close = close | (gd.isnan() & wd.isnan()) | (gd == wd); // == covers equal infinities
    bad = close.logical_not();
  } else {
    bad = g.ne(w);
  }
  torch::Tensor idx = bad.nonzero();
  if (idx.numel() == 0) return "";
  int64_t i = idx[0][0].item<int64_t>();
  return what + " differs at index " + std::to_string(i) + ": " + valueText(g, i) + " vs " +
         valueText(w, i) + " (" + std::to_string(idx.size(0)) + " of " + std::to_string(w.numel()) +
         " elements differ)";
}

/// Runs one test_data_set against the imported model.
void runDataSet(const onnx::ModelProto &proto, const import::InferenceModel &m, const fs::path &data) {
  const ir::Graph &g = m.graph;
  const auto &pg = proto.graph();
  ValueMap env;
  std::vector<bool> random(g.values.size(), false);
  for (ir::ValueId id : g.parameters) env[id] = toTorch(m.weights.at(g.values[id].name));
  for (ir::ValueId id : g.buffers) env[id] = toTorch(m.weights.at(g.values[id].name));
  for (ir::ValueId id : g.constants) env[id] = toTorch(g.constant_data.at(id));

  // input_i.pb numbers the graph inputs that are not initializers; very old
  // models list initializers as inputs too, and then the files cover all.
  std::set<std::string> inits;
  for (const auto &t : pg.initializer()) inits.insert(t.name());
  std::vector<const onnx::ValueInfoProto *> fed, all;
  for (const auto &vi : pg.input()) {
    all.push_back(&vi);
    if (!inits.count(vi.name())) fed.push_back(&vi);
  }
  std::vector<fs::path> inputs = numberedFiles(data, "input_");
  if (inputs.size() == all.size() && all.size() > fed.size()) fed = all;
  if (inputs.size() != fed.size())
    failCase(data.filename().string() + " has " + std::to_string(inputs.size()) +
             " input files for " + std::to_string(fed.size()) + " graph inputs");
  for (size_t i = 0; i < fed.size(); ++i) {
    ir::ValueId id = g.findValue(fed[i]->name());
    if (id == ir::kNoValue) failCase("graph input '" + fed[i]->name() + "' was not imported");
    env[id] = readTensor(inputs[i], fed[i]->type().tensor_type().elem_type());
  }

  NodeHooks hooks;
  hooks.missing = [&](const ir::Node &node, ir::ValueId v) -> std::optional<torch::Tensor> {
    failCase("node '" + node.name + "' reads '" + g.values[v].name + "', which has no value");
  };
  hooks.failed = [](const ir::Node &, const std::exception &e) { failCase(e.what()); };
  hooks.ran = [&](ir::NodeId n, const std::vector<torch::Tensor> &ins, std::vector<torch::Tensor> &outs) {
    const ir::Node &node = g.nodes[n];
    bool random_in = false;
    for (ir::ValueId v : node.inputs) random_in = random_in || (v != ir::kNoValue && random[v]);
    bool training_dropout = node.op_type == "Dropout" && ins.size() > 2 && ins[2].defined() &&
                            ins[2].item<bool>() && !(ins[1].defined() && ins[1].item<double>() == 0);
    bool is_random = random_in || training_dropout || randomOps().count(node.op_type);
    for (ir::ValueId v : node.outputs)
      if (v != ir::kNoValue) random[v] = is_random;
    if (training_dropout && node.outputs.size() > 1 && node.outputs[1] != ir::kNoValue) {
      // Structure of a random dropout: kept elements scaled by 1/(1-ratio).
      double r = ins[1].defined() ? ins[1].item<double>() : 0.5;
      torch::Tensor x = ins[0].to(torch::kDouble), y = outs[0].to(torch::kDouble), mask = outs[1];
      torch::Tensor want = torch::where(mask, x / (1 - r), torch::zeros_like(x));
      if (!torch::allclose(y, want, 1e-4, 1e-6))
        failCase("Dropout output is not the input scaled by 1/(1-ratio) where the mask keeps it");
    }
  };
  runNodes(g, allNodes(g), env, hooks);

  std::vector<fs::path> outputs = numberedFiles(data, "output_");
  if (outputs.size() != m.outputs.size())
    failCase(data.filename().string() + " has " + std::to_string(outputs.size()) +
             " output files for " + std::to_string(m.outputs.size()) + " graph outputs");
  for (size_t i = 0; i < outputs.size(); ++i) {
    ir::ValueId id = m.outputs[i];
    torch::Tensor want = readTensor(outputs[i], pg.output(int(i)).type().tensor_type().elem_type());
    std::string diff;
    if (random[id]) {
      // Random values: only the dtype and shape are reproducible.
      const torch::Tensor &got = env[id];
      if (!got.defined()) diff = "output " + std::to_string(i) + " was not computed";
      else if (got.scalar_type() != want.scalar_type() || got.sizes() != want.sizes())
        diff = "random output " + std::to_string(i) + " has type/shape " +
               c10::toString(got.scalar_type()) + shapeText(got.sizes()) + ", expected " +
               c10::toString(want.scalar_type()) + shapeText(want.sizes());
    } else {
      diff = compareOutput(i, env[id], want);
    }
    if (!diff.empty()) failCase(diff);
  }
}

/// One line, at most ~400 characters (LibTorch messages can span lines).
std::string oneLine(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  if (s.size() > 400) s = s.substr(0, 397) + "...";
  return s;
}

} // namespace

CaseResult runConformanceCase(const std::string &dir_name) {
  fs::path dir(dir_name);
  try {
    onnx::ModelProto proto;
    std::string bytes = readBytes(dir / "model.onnx");
    if (!proto.ParseFromString(bytes)) failCase("model.onnx is not a valid ONNX model");
    Scope scope = scopeOf(proto);
    if (!scope.skip.empty()) return {CaseOutcome::Skip, scope.skip};
    auto m = import::importOnnxInference(bytes, "model.onnx");
    if (!m) failCase(m.error().message);
    std::vector<fs::path> sets;
    for (const auto &e : fs::directory_iterator(dir))
      if (e.is_directory() && e.path().filename().string().rfind("test_data_set_", 0) == 0)
        sets.push_back(e.path());
    std::sort(sets.begin(), sets.end());
    if (sets.empty()) failCase("no test_data_set_* folder");
    for (const auto &set : sets) runDataSet(proto, *m, set);
    return {CaseOutcome::Pass, ""};
  } catch (const CaseStop &s) {
    return {s.outcome, s.reason};
  } catch (const c10::Error &e) {
    return {CaseOutcome::Fail, e.what_without_backtrace()};
  } catch (const std::exception &e) {
    return {CaseOutcome::Fail, e.what()};
  }
}

int runConformance(const ConformanceOptions &opts, std::ostream &out, std::ostream &err) {
  // (name, folder) of every case, named by the searched folder's own name and
  // the path below it ("node/test_abs").
  std::vector<std::pair<std::string, fs::path>> cases;
  for (const std::string &d : opts.dirs) {
    fs::path root = fs::path(d).lexically_normal();
    if (root.has_filename() == false) root = root.parent_path();
    std::error_code ec;
    if (!fs::is_directory(root, ec)) {
      err << "rannc-conformance: " << d << ": not a folder\n";
      return 2;
    }
    std::string base = root.filename().string();
    if (fs::exists(root / "model.onnx")) cases.emplace_back(base, root);
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
      if (!it->is_directory() || !fs::exists(it->path() / "model.onnx")) continue;
      cases.emplace_back(base + "/" + fs::relative(it->path(), root).generic_string(), it->path());
    }
  }
  std::sort(cases.begin(), cases.end());
  int passed = 0, failed = 0, skipped = 0;
  for (const auto &[name, dir] : cases) {
    if (!opts.filter.empty() && name.find(opts.filter) == std::string::npos) continue;
    CaseResult r = runConformanceCase(dir.string());
    switch (r.outcome) {
    case CaseOutcome::Pass:
      ++passed;
      if (!opts.quiet) out << "PASS " << name << "\n";
      break;
    case CaseOutcome::Fail:
      ++failed;
      out << "FAIL " << name << ": " << oneLine(r.reason) << "\n";
      break;
    case CaseOutcome::Skip:
      ++skipped;
      if (!opts.quiet) out << "SKIP " << name << ": " << oneLine(r.reason) << "\n";
      break;
    }
    out.flush();
  }
  out << passed << " passed, " << failed << " failed, " << skipped << " skipped\n";
  if (passed + failed + skipped == 0) {
    err << "rannc-conformance: no test cases found\n";
    return 1;
  }
  if (opts.min_pass_rate) {
    double rate = passed + failed == 0 ? 1.0 : double(passed) / double(passed + failed);
    return rate >= *opts.min_pass_rate ? 0 : 1;
  }
  return failed == 0 ? 0 : 1;
}

} // namespace rannc::runtime
