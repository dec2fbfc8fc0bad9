#include "executor/checkpoint/onnx_export.h"

#include <onnx/onnx_pb.h>

#include <filesystem>
#include <set>

#include "executor/checkpoint/checkpoint_dir.h"
#include "planner/import/model_format.h"
#include "planner/import/onnx_import.h"
#include "planner/import/onnx_signature.h"
#include "planner/import/onnx_weights.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::checkpoint {
namespace {

std::string describe(const std::string &dtype, const std::vector<int64_t> &dims) {
  std::string s = dtype + "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? "," : "") + std::to_string(dims[i]);
  return s + "]";
}

} // namespace

Expected<int> writeOnnxWithWeights(const std::string &model_path, const std::map<std::string, ir::Tensor> &weights,
                                   const std::string &out) {
  auto bytes = readFile(model_path);
  if (!bytes) return bytes.error();
  onnx::ModelProto model;
  if (!model.ParseFromString(*bytes)) return Error{model_path + ": not a valid ONNX model"};
  const std::filesystem::path dir = std::filesystem::path(model_path).parent_path();
  // The trained parameters are the restored graph's (Note [export signature]).
  auto sig = import::restoreSignature(model, dir.string(), model_path, nullptr);
  if (!sig) return sig.error();
  std::set<std::string> replaced;
  for (auto &init : *model.mutable_graph()->mutable_initializer()) {
    auto it = weights.find(init.name());
    if (it == weights.end()) {
      // Untrained initializers in external data (a dynamo export's folded
      // constants) are written inline: the file stands alone.
      if (init.data_location() != onnx::TensorProto::EXTERNAL) continue;
      auto data = import::readExternal(init, dir, model_path);
      if (!data) return data.error();
      init.clear_external_data();
      init.clear_data_location();
      init.set_raw_data(data->data);
      continue;
    }
    const ir::Tensor &w = it->second;
    auto dtype = import::dtypeFromOnnx(init.data_type());
    const std::vector<int64_t> dims(init.dims().begin(), init.dims().end());
    if (!dtype || *dtype != w.dtype || dims != w.dims)
      return Error{model_path + ": initializer '" + init.name() + "' is " +
                   describe(std::string(dtype ? ir::dtypeName(*dtype) : "?"), dims) + ", the trained weight is " +
                   describe(std::string(ir::dtypeName(w.dtype)), w.dims) + " (not the model it was trained from?)"};
    // Raw little-endian bytes; the typed fields must go, or readers would see both.
    init.clear_float_data();
    init.clear_double_data();
    init.clear_int32_data();
    init.clear_int64_data();
    init.clear_uint64_data();
    init.clear_external_data();
    init.clear_data_location();
    init.set_raw_data(w.data);
    replaced.insert(init.name());
  }
  for (const auto &[name, w] : weights)
    if (!replaced.count(name))
      return Error{model_path + ": has no initializer named '" + name + "' (not the model it was trained from?)"};
  std::string blob;
  if (!model.SerializeToString(&blob)) return Error{out + ": cannot serialize the model (over 2 GiB?)"};
  if (Status st = writeFileAtomic(out, blob); !st) return Error{st.message()};
  return int(replaced.size());
}

// Note [TorchScript buffers]
// A module's state_dict leaves out the buffers it registered with
// persistent=False (a rotary embedding's inv_freq in Hugging Face's models),
// so load_state_dict(strict=True) refuses a dict that has them. A torch.export
// archive records which buffers those are (its graph signature), and the
// state dict of such a model leaves them out by itself. A TorchScript archive
// does not: torch.jit.save pickles every buffer alike and lists them all in
// the class's __buffers__ (torch.jit.load(path).state_dict() has them too).
// So a TorchScript model's state dict holds every buffer the model reads; the
// user, who knows the module, leaves out the non-persistent ones with
// --drop-keys, and a name that is no key is an error rather than a silent
// no-op. (tests/integration/cli_check.py --case export checks both.)
Status dropKeys(std::map<std::string, ir::Tensor> &weights, const std::vector<std::string> &keys) {
  for (const std::string &k : keys)
    if (weights.erase(k) == 0) {
      std::string some;
      for (const auto &[name, t] : weights) some += (some.empty() ? "" : ", ") + name;
      return Error{"--drop-keys: the state dict has no key '" + k + "' (its keys: " + some + ")"};
    }
  return Status::success();
}

const char *torchScriptBuffersNote() {
  return "rannc-exec: note: a TorchScript archive does not record which buffers are persistent, so the state dict "
         "holds every buffer the model reads; leave out those your module registers with persistent=False with "
         "--drop-keys NAME,... (docs/training.md)\n";
}

Status exportCheckpoint(const ExportOptions &o, std::ostream &log) {
  auto c = openCheckpoint(o.checkpoint);
  if (!c) return Error{c.error().message};
  const std::string model = o.model.empty() ? c->manifest.model_path : o.model;
  {
    auto bytes = readFile(model);
    if (!bytes)
      return Error{bytes.error().message + (o.model.empty() ? " (the model the checkpoint names; pass --model PATH)" : "")};
    if (sha256Hex(*bytes) != c->manifest.model_sha256)
      return Error{model + ": not the model this checkpoint was trained from (SHA-256 differs from " + c->dir +
                   "'s " + c->manifest.model_sha256.substr(0, 12) + "...)"};
  }
  auto weights = readWeights(*c);
  if (!weights) return Error{weights.error().message};
  if (import::isTorchScriptPath(model) || import::isTorchExportPath(model)) {
    if (!o.write_state) return Error{model + ": a LibTorch model, whose export is a state dict: use rannc-exec export"};
    if (Status st = dropKeys(*weights, o.drop_keys); !st) return st;
    if (Status st = o.write_state(model, *weights, o.output); !st) return st;
    log << "rannc-exec: wrote " << o.output << ": a state dict (torch.load; load_state_dict) from " << c->dir << " (step " << c->manifest.step << ")\n";
    if (import::isTorchScriptPath(model) && o.drop_keys.empty()) log << torchScriptBuffersNote();
    return Status::success();
  }
  if (!o.drop_keys.empty()) return Error{"--drop-keys: " + model + " is an ONNX model, whose export is the model, not a state dict"};
  auto n = writeOnnxWithWeights(model, *weights, o.output);
  if (!n) return Error{n.error().message};
  log << "rannc-exec: wrote " << o.output << ": " << *n << " trained initializer(s) from " << c->dir << " (step "
      << c->manifest.step << ")\n";
  return Status::success();
}

} // namespace rannc::checkpoint
