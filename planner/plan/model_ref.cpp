#include "planner/plan/model_ref.h"

#include <filesystem>

#include "planner/import/model_format.h"
#include "planner/support/files.h"
#include "planner/support/sha256.h"

namespace rannc::plan {
namespace fs = std::filesystem;
namespace {

std::string short12(const std::string &sha) { return sha.substr(0, 12) + "..."; }

} // namespace

std::string modelFormat(const std::string &path) {
  if (import::isTorchExportPath(path)) return "torch.export";
  if (import::isTorchScriptPath(path)) return "torchscript";
  return "onnx";
}

Expected<proto::ModelRef> describeModel(const std::string &path, const ir::Graph &g, const std::string &inputs_from) {
  proto::ModelRef ref;
  ref.set_path(path);
  ref.set_format(modelFormat(path));
  auto sha = hashFile(path);
  if (!sha) return sha.error();
  ref.set_sha256(*sha);
  for (ir::ValueId id : g.inputs) {
    const ir::Value &v = g.values[id];
    proto::ModelInput *in = ref.add_inputs();
    in->set_name(v.name);
    in->set_dtype(std::string(ir::dtypeName(v.dtype)));
    in->set_shape(v.shape_known ? ir::shapeString(v.shape) : "[*]");
  }
  ref.set_inputs_from(inputs_from);
  if (!g.external_data.empty()) {
    const std::filesystem::path dir = std::filesystem::path(path).parent_path();
    for (const std::string &f : g.external_data) {
      auto file = insideFolder(dir.string(), f, "external data location");
      if (!file) return Error{path + ": " + file.error().message};
      std::error_code ec;
      // Absent: a weightless model (--init-weights); present but no regular file: hashFile says so.
      if (!std::filesystem::exists(*file, ec)) continue;
      auto fsha = hashFile(*file);
      if (!fsha) return fsha.error();
      proto::ModelFile *mf = ref.add_external_data();
      mf->set_path(f);
      mf->set_sha256(*fsha);
    }
  }
  return ref;
}

Status checkRecordedModelPath(const std::string &path) {
  // Note [hostile inputs]: a plan from elsewhere must not make check or
  // rannc-exec read (and hash) any file it names.
  auto known = [](const std::string &p) {
    const std::string ext = extensionOf(p);
    return ext == ".onnx" || ext == ".pt" || ext == ".pth" || ext == ".torchscript" || ext == ".pt2";
  };
  if (!known(path))
    return Error{"model.path '" + path + "' does not name a model file (.onnx, .pt, .pth, .torchscript or .pt2); "
                 "pass --model PATH"};
  std::error_code ec;
  const std::filesystem::path real = std::filesystem::weakly_canonical(path, ec);
  if (!ec && !known(real.string()))
    return Error{"model.path '" + path + "' is a symlink to " + real.string() + ", not a model file; pass --model PATH"};
  return Status::success();
}

std::string recordedModelPath(const std::string &model, const std::string &plan_file) {
  if (plan_file.empty() || model.empty()) return model; // a plan made in memory (tests)
  std::error_code ec;
  const fs::path dir = fs::absolute(fs::path(plan_file), ec).parent_path();
  const fs::path abs = fs::absolute(fs::path(model), ec).lexically_normal();
  if (ec) return model;
  const fs::path rel = abs.lexically_relative(dir.lexically_normal());
  return rel.empty() ? model : rel.string();
}

void rebaseModelPath(proto::Plan &plan, const std::string &from, const std::string &to) {
  const fs::path p(plan.model().path());
  if (p.empty() || p.is_absolute()) return;
  plan.mutable_model()->set_path(recordedModelPath((fs::path(from).parent_path() / p).string(), to));
}

Expected<std::string> resolveRecordedModelPath(const std::string &recorded, const std::string &plan_file,
                                               bool allow_outside) {
  // What the file is first (the hostile cases' errors), then where it is.
  if (Status st = checkRecordedModelPath(recorded); !st) return Error{st.message()};
  const fs::path dir = fs::path(plan_file).parent_path(), p(recorded);
  const std::string path = p.is_absolute() || dir.empty() ? recorded : (dir / p).lexically_normal().string();
  if (Status st = checkRecordedModelPath(path); !st) return Error{st.message()};
  if (allow_outside) return path;
  auto inside = insideFolder(dir.string(), recorded, "model.path");
  if (!inside)
    return Error{inside.error().message + ": a plan may name only a model in its own folder; pass --model PATH, or "
                                          "--allow-model-outside-plan if you trust this plan"};
  return path;
}

Status verifyModelFiles(const std::string &path, const proto::ModelRef &ref) {
  auto sha = hashFile(path);
  if (!sha) return Error{sha.error().message + " (the model the plan names; pass --model PATH if it moved)"};
  if (*sha != ref.sha256())
    return Error{path + ": the model file changed since planning (SHA-256 " + short12(*sha) + ", the plan's " +
                 short12(ref.sha256()) + "); re-run rannc-plan"};
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  for (const proto::ModelFile &f : ref.external_data()) {
    auto inside = insideFolder(dir.string(), f.path(), "model.external_data path");
    if (!inside) return Error{path + ": " + inside.error().message};
    const std::string file = *inside;
    std::error_code ec;
    if (!std::filesystem::is_regular_file(file, ec))
      return Error{file + ": the external data the plan recorded is missing (its weights; restore it, or re-plan "
                          "the model without it)"};
    auto fsha = hashFile(file);
    if (!fsha) return Error{fsha.error().message + " (external data of " + path + ")"};
    if (*fsha != f.sha256())
      return Error{file + ": the model's external data changed since planning (SHA-256 " + short12(*fsha) +
                   ", the plan's " + short12(f.sha256()) + "); re-run rannc-plan"};
  }
  return Status::success();
}

} // namespace rannc::plan
