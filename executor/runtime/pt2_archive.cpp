#include "executor/runtime/pt2_archive.h"

#include <caffe2/serialize/inline_container.h>

namespace rannc::runtime {
namespace {

/// Size i of a serialized tensor_meta ({"as_int": n}); -1 when symbolic.
int64_t metaInt(const nlohmann::json &v) { return v.contains("as_int") ? v.at("as_int").get<int64_t>() : -1; }

Expected<torch::Tensor> tensorFromRecord(caffe2::serialize::PyTorchStreamReader &reader, const std::string &record,
                                         const nlohmann::json &meta, const std::string &where) {
  auto dtype = scalarTypeFromExport(meta.at("dtype").get<int64_t>());
  if (!dtype) return Error{where + ": " + dtype.error().message};
  std::vector<int64_t> sizes, strides;
  for (const auto &s : meta.at("sizes")) sizes.push_back(metaInt(s));
  for (const auto &s : meta.at("strides")) strides.push_back(metaInt(s));
  const int64_t offset = meta.contains("storage_offset") ? metaInt(meta.at("storage_offset")) : 0;
  for (int64_t v : sizes)
    if (v < 0) return Error{where + ": a weight of symbolic size"};
  auto [data, bytes] = reader.getRecord(record);
  const int64_t elem = int64_t(c10::elementSize(*dtype));
  torch::Tensor storage = torch::empty({int64_t(bytes) / elem}, torch::TensorOptions().dtype(*dtype));
  std::memcpy(storage.data_ptr(), data.get(), size_t(storage.numel() * elem));
  // The record is the whole storage; the tensor a strided view of it.
  int64_t last = offset;
  for (size_t i = 0; i < sizes.size(); ++i) last += (sizes[i] - 1) * strides[i];
  if (!sizes.empty() && last >= storage.numel() && storage.numel() > 0)
    return Error{where + ": its sizes and strides reach past the stored bytes"};
  return storage.as_strided(sizes, strides, offset).clone();
}

} // namespace

Expected<c10::ScalarType> scalarTypeFromExport(int64_t code) {
  switch (code) {
  case 1: return c10::kByte;
  case 2: return c10::kChar;
  case 3: return c10::kShort;
  case 4: return c10::kInt;
  case 5: return c10::kLong;
  case 6: return c10::kHalf;
  case 7: return c10::kFloat;
  case 8: return c10::kDouble;
  case 12: return c10::kBool;
  case 13: return c10::kBFloat16;
  case 10: return c10::kComplexFloat; // a rotary embedding's torch.polar / view_as_complex
  case 11: return c10::kComplexDouble;
  case 9:
    return Error{"a complex32 tensor (torch.export dtype code 9), which rannc does not run: complex tensors must "
                 "be complex64 or complex128"};
  default: return Error{"unsupported torch.export dtype code " + std::to_string(code)};
  }
}

std::set<std::string> nonPersistentBuffers(const nlohmann::json &program) {
  std::set<std::string> out;
  const auto &sig = program.at("graph_module").at("signature");
  for (const auto &spec : sig.at("input_specs")) {
    if (spec.begin().key() != "buffer") continue;
    const auto &body = spec.begin().value();
    if (!body.value("persistent", true)) out.insert(body.at("buffer_name").get<std::string>());
  }
  return out;
}

Expected<Pt2Archive> readPt2Archive(const std::string &path, const std::set<std::string> *only) {
  Pt2Archive a;
  try {
    caffe2::serialize::PyTorchStreamReader reader(path);
    // The program is models/<name>.json; weights and constants are listed by
    // data/{weights,constants}/<...>_config.json, each entry naming its
    // tensor's file (torch.export.save's layout in PyTorch 2.x).
    std::string program_record;
    std::vector<std::pair<std::string, std::string>> configs; // (kind, record)
    auto endsWith = [](const std::string &r, std::string_view tail) {
      return r.size() > tail.size() && r.compare(r.size() - tail.size(), tail.size(), tail) == 0;
    };
    for (const std::string &r : reader.getAllRecords()) {
      if (r.rfind("models/", 0) == 0 && endsWith(r, ".json") && r.find('/', 7) == std::string::npos) {
        if (!program_record.empty())
          return Error{path + ": the archive holds several programs (" + program_record + ", " + r +
                       "); rannc reads one"};
        program_record = r;
      }
      for (const char *kind : {"weights", "constants"})
        if (r.rfind(std::string("data/") + kind + "/", 0) == 0 && endsWith(r, "_config.json"))
          configs.emplace_back(kind, r);
    }
    if (program_record.empty()) return Error{path + ": no models/<name>.json: not a torch.export.save archive"};
    auto [data, bytes] = reader.getRecord(program_record);
    a.program = nlohmann::json::parse(static_cast<const char *>(data.get()),
                                      static_cast<const char *>(data.get()) + bytes);
    for (const auto &[kind, config] : configs) {
      auto [cdata, cbytes] = reader.getRecord(config);
      const auto cfg = nlohmann::json::parse(static_cast<const char *>(cdata.get()),
                                             static_cast<const char *>(cdata.get()) + cbytes);
      if (!cfg.contains("config")) continue;
      for (const auto &[name, entry] : cfg.at("config").items()) {
        const std::string record = "data/" + kind + "/" + entry.at("path_name").get<std::string>();
        a.storage_of[name] = record;
        if (only && !only->count(name)) continue;
        if (entry.value("use_pickle", false))
          return Error{path + ": '" + name + "' is stored pickled, which rannc does not read"};
        auto t = tensorFromRecord(reader, record, entry.at("tensor_meta"), path + ": '" + name + "'");
        if (!t) return t.error();
        a.tensors.emplace(name, std::move(*t));
      }
    }
  } catch (const nlohmann::json::exception &e) {
    return Error{path + ": malformed torch.export program: " + firstLine(e.what())};
  } catch (const std::exception &e) {
    return Error{path + ": not a torch.export archive this LibTorch (" + std::string(TORCH_VERSION) +
                 ") can read: " + firstLine(e.what())};
  }
  return a;
}

} // namespace rannc::runtime
