#include "planner/import/model_format.h"

#include "planner/import/onnx_import.h"
#include "planner/support/files.h"

namespace rannc::import {

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

} // namespace rannc::import
