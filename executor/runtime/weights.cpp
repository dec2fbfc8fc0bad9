#include "executor/runtime/weights.h"

#include "planner/import/model_format.h"
#include "planner/import/onnx_import.h"

#include <torch/script.h>

#include <set>
#include <stdexcept>
#include <string_view>

#include "executor/runtime/ops.h"
#include "executor/runtime/pt2_archive.h"

namespace rannc::runtime {
namespace {

uint64_t fnv1a(std::string_view s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

bool isNormalization(const ir::Node &n) {
  return n.domain.empty() && (n.op_type == "BatchNormalization" || n.op_type == "LayerNormalization" ||
                              n.op_type == "InstanceNormalization");
}

} // namespace

std::map<ir::ValueId, torch::Tensor> initialTensors(const ir::Graph &g, const std::vector<ir::ValueId> &values,
                                                    uint64_t seed) {
  const auto users = g.users();
  std::map<ir::ValueId, torch::Tensor> out;
  for (ir::ValueId v : values) {
    const ir::Value &val = g.values[v];
    if (!val.shape_known) throw std::runtime_error("cannot initialize '" + val.name + "': its shape is unknown");
    std::vector<int64_t> dims;
    for (const ir::Dim &d : val.shape) {
      if (!d.isFixed())
        throw std::runtime_error("cannot initialize '" + val.name + "': shape " + ir::shapeString(val.shape) +
                                 " is not fixed");
      dims.push_back(d.offset);
    }
    if (!ir::isFloating(val.dtype)) { // an integer or boolean buffer (num_batches_tracked, position ids)
      out[v] = torch::zeros(dims, torch::TensorOptions().dtype(toScalarType(val.dtype)));
      continue;
    }
    // The role the first normalization reading it gives it (Note [initial weights]).
    int fill = -1; // -1: random (or 0 for rank <= 1); 0 or 1: constant
    for (ir::NodeId n : users[v]) {
      const ir::Node &node = g.nodes[n];
      if (!isNormalization(node)) continue;
      for (size_t i = 1; i < node.inputs.size() && fill < 0; ++i)
        if (node.inputs[i] == v) fill = (i == 1 || i == 4) ? 1 : 0;
      break;
    }
    auto f32 = torch::TensorOptions().dtype(torch::kFloat);
    torch::Tensor t;
    if (fill >= 0) {
      t = torch::full(dims, double(fill), f32);
    } else if (dims.size() <= 1) {
      t = torch::zeros(dims, f32);
    } else {
      auto gen = at::detail::createCPUGenerator(splitmix64(seed ^ fnv1a(val.name)));
      t = torch::randn(dims, gen, f32) * 0.02;
    }
    out[v] = t.to(toScalarType(val.dtype));
  }
  return out;
}

namespace {

/// A stage's weights from tensors by state_dict name.
Expected<StageWeights> namedStageWeights(const ir::Graph &g, const schedule::StageProgram &program,
                                         const std::string &model, const std::map<std::string, torch::Tensor> &named) {
  StageWeights w;
  auto get = [&](ir::ValueId v) -> Expected<torch::Tensor> {
    auto it = named.find(g.values[v].name);
    if (it == named.end()) return Error{model + ": the archive has no parameter or buffer '" + g.values[v].name + "'"};
    return it->second.detach().clone();
  };
  for (ir::ValueId p : program.parameters) {
    auto t = get(p);
    if (!t) return t.error();
    w.params[p] = t->set_requires_grad(true);
  }
  for (ir::ValueId b : program.buffers) {
    auto t = get(b);
    if (!t) return t.error();
    w.buffers[b] = *t;
  }
  return w;
}

/// A TorchScript archive's parameters and buffers by state_dict name.
Expected<StageWeights> loadTorchScriptWeights(const ir::Graph &g, const schedule::StageProgram &program,
                                              const std::string &model) {
  std::map<std::string, torch::Tensor> named;
  try {
    torch::jit::Module m = torch::jit::load(model);
    for (const auto &p : m.named_parameters(true)) named.emplace(p.name, p.value);
    for (const auto &b : m.named_buffers(true)) named.emplace(b.name, b.value);
  } catch (const std::exception &e) {
    return Error{model + ": cannot load the TorchScript archive: " + firstLine(e.what())};
  }
  return namedStageWeights(g, program, model, named);
}

/// A torch.export program's weights by state_dict name.
Expected<StageWeights> loadTorchExportWeights(const ir::Graph &g, const schedule::StageProgram &program,
                                              const std::string &model) {
  std::set<std::string> names;
  for (const auto *ids : {&program.parameters, &program.buffers})
    for (ir::ValueId v : *ids) names.insert(g.values[v].name);
  auto archive = readPt2Archive(model, &names);
  if (!archive) return archive.error();
  return namedStageWeights(g, program, model, archive->tensors);
}

} // namespace

Expected<StageWeights> loadStageWeights(const ir::Graph &g, const schedule::StageProgram &program,
                                        const std::string &model, std::optional<uint64_t> init_seed) {
  if (import::isTorchScriptPath(model)) return loadTorchScriptWeights(g, program, model);
  if (import::isTorchExportPath(model)) return loadTorchExportWeights(g, program, model);
  std::vector<ir::ValueId> wanted = program.parameters;
  wanted.insert(wanted.end(), program.buffers.begin(), program.buffers.end());
  std::vector<std::string> names;
  for (ir::ValueId v : wanted) names.push_back(g.values[v].name);
  std::vector<import::MissingWeight> missing;
  auto loaded = import::loadModelWeights(model, names, &missing);
  if (!loaded) return loaded.error();
  if (!missing.empty() && !init_seed)
    return Error{model + ": the model file holds no weights for " + std::to_string(missing.size()) +
                 " of this stage's " + std::to_string(names.size()) + " parameters and buffers (e.g. '" +
                 missing.front().name + "': " + missing.front().reason +
                 "); pass --init-weights SEED to train from deterministic initial weights"};
  std::vector<ir::ValueId> absent;
  for (const auto &m : missing) absent.push_back(g.findValue(m.name));
  std::map<ir::ValueId, torch::Tensor> made;
  try {
    made = initialTensors(g, absent, init_seed.value_or(0));
  } catch (const std::exception &e) {
    return Error{model + ": " + e.what()};
  }
  StageWeights w;
  auto get = [&](ir::ValueId v) {
    auto it = loaded->find(g.values[v].name);
    return it != loaded->end() ? toTorch(it->second) : made.at(v);
  };
  for (ir::ValueId p : program.parameters) w.params[p] = get(p).set_requires_grad(true);
  for (ir::ValueId b : program.buffers) w.buffers[b] = get(b);
  return w;
}

} // namespace rannc::runtime
