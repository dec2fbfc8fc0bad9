#include "planner/import/model_format.h"

#include <set>
#include <string_view>

#include "planner/import/onnx_import.h"
#include "planner/ir/aten_arg_list.h"
#include "planner/ir/op_set.h"
#include "planner/support/files.h"

namespace rannc::import {

namespace {

// Note [random ops in training]
// A model that draws random numbers while it trains (dropout with p > 0;
// PhiMoE's router samples its experts with Gumbel noise, aten::exponential_,
// and draws Heun's mask with rand_like) takes a different sample path in
// rannc than in PyTorch: each stage draws from LibTorch's generator in its own
// order, not from PyTorch's one stream, and a pipeline draws per micro-batch.
// Its losses agree with PyTorch's in distribution, not step for step. The
// import cannot fix that, so it warns: to compare with PyTorch exactly, set
// the model's probabilities to 0 (dropout, jitter) or train it in eval mode.

/// ATen ops that always draw, by schema name.
const std::set<std::string_view> kRandomAten = {
    "aten::bernoulli", "aten::bernoulli_", "aten::rand",        "aten::rand_like",  "aten::randn",
    "aten::randn_like", "aten::randint",   "aten::randint_like", "aten::randperm",  "aten::normal",
    "aten::normal_",    "aten::uniform_",  "aten::exponential_", "aten::geometric_", "aten::cauchy_",
    "aten::log_normal_", "aten::random_",  "aten::multinomial",  "aten::poisson",   "aten::rrelu_with_noise"};
/// ATen dropouts: (input, p, train); they draw unless p is a constant 0 or train a constant false.
const std::set<std::string_view> kAtenDropouts = {"aten::dropout", "aten::native_dropout", "aten::feature_dropout",
                                                  "aten::alpha_dropout", "aten::feature_alpha_dropout"};
/// ONNX ops that always draw.
const std::set<std::string_view> kRandomOnnx = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                "RandomUniformLike", "Bernoulli", "Multinomial"};

/// True when `n` draws random numbers as it runs in training.
bool drawsRandomNumbers(const ir::Graph &g, const ir::Node &n) {
  if (ir::isAten(n)) {
    if (kRandomAten.count(n.op_type)) return true;
    if (!kAtenDropouts.count(n.op_type)) return false;
    const std::vector<ir::AtenArg> args = ir::atenArgs(n); // dropout(input, p, train)
    const ir::AttrValue *p = args.size() > 1 ? args[1].constant : nullptr;
    const ir::AttrValue *train = args.size() > 2 ? args[2].constant : nullptr;
    bool zero = p && ((std::holds_alternative<double>(*p) && std::get<double>(*p) == 0.0) ||
                      (std::holds_alternative<int64_t>(*p) && std::get<int64_t>(*p) == 0));
    bool eval = train && std::holds_alternative<int64_t>(*train) && std::get<int64_t>(*train) == 0;
    return !zero && !eval;
  }
  if (!n.domain.empty()) return false;
  if (kRandomOnnx.count(n.op_type)) return true;
  if (n.op_type != "Dropout" || n.inputs.size() < 3 || n.inputs[2] == ir::kNoValue) return false; // inference
  // Dropout(data, ratio = 0.5, training_mode): a constant ratio of 0 or a constant false mode is the identity.
  auto allZero = [&](ir::ValueId v) {
    auto c = g.constant_data.find(v);
    return c != g.constant_data.end() && c->second.data.find_first_not_of('\0') == std::string::npos;
  };
  return !(n.inputs.size() > 1 && n.inputs[1] != ir::kNoValue && allZero(n.inputs[1])) && !allZero(n.inputs[2]);
}

/// Warns of the nodes that draw random numbers in training (Note [random ops in training]).
void auditRandomOps(const ir::Graph &g, ImportAudit &audit) {
  std::vector<std::string> names;
  for (const ir::Node &n : g.nodes)
    if (drawsRandomNumbers(g, n)) names.push_back(n.name + " (" + n.op_type + ")");
  if (!names.empty())
    audit.add(AuditAction::Warning, "random numbers",
              "drawn in training by rannc's own generator, not PyTorch's stream: losses match PyTorch's in "
              "distribution, not step for step (set the probabilities to 0 to compare)",
              std::move(names));
}

/// The one dispatch to the front end that reads `path` (Note [import layering]).
Expected<ir::Graph> importFile(const std::string &path, const std::string &data_dir, const TorchImporters *torch,
                               ImportAudit &audit) {
  const ModelFormat format = modelFormat(path);
  if (format != ModelFormat::Onnx && !torch)
    return Error{path + ": a LibTorch archive, which the ONNX importer does not read "
                        "(rannc-plan imports it through executor/frontend)"};
  // LibTorch's loaders open whatever the path names: a FIFO would hang them (Note [hostile inputs]).
  if (auto file = openInput(path); !file) return file.error();
  const Error unavailable{path + ": TorchScript and torch.export import is not available in this tool"};
  switch (format) {
  case ModelFormat::TorchScript:
    if (!torch->torchscript) return unavailable;
    return torch->torchscript(path, data_dir);
  case ModelFormat::TorchExport:
    if (!torch->torch_export) return unavailable;
    if (!data_dir.empty())
      return Error{"--data " + data_dir + ": " + path + " is a torch.export program, which describes its own inputs"};
    return torch->torch_export(path, &audit);
  case ModelFormat::Onnx:
    break;
  }
  if (!data_dir.empty())
    return Error{"--data " + data_dir + ": describes the inputs of a TorchScript archive; " + path +
                 " declares its own"};
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  return importOnnxBytes(*bytes, path, &audit);
}

} // namespace

ModelFormat modelFormat(const std::string &path) {
  const std::string ext = extensionOf(path);
  if (ext == ".pt" || ext == ".pth" || ext == ".torchscript") return ModelFormat::TorchScript;
  if (ext == ".pt2") return ModelFormat::TorchExport;
  return ModelFormat::Onnx;
}

bool isTorchScriptPath(const std::string &path) { return modelFormat(path) == ModelFormat::TorchScript; }

bool isTorchExportPath(const std::string &path) { return modelFormat(path) == ModelFormat::TorchExport; }

Expected<ir::Graph> importModel(const std::string &path, const std::string &data_dir, const TorchImporters *torch) {
  ImportAudit ignored;
  return importModel(path, data_dir, torch, ignored);
}

Expected<ir::Graph> importModel(const std::string &path, const std::string &data_dir, const TorchImporters *torch,
                                ImportAudit &audit) {
  Expected<ir::Graph> g = importFile(path, data_dir, torch, audit);
  if (g) auditRandomOps(*g, audit);
  return g;
}

} // namespace rannc::import
