#include "planner/import/onnx_weights.h"

#include <onnx/onnx_pb.h>

#include <set>

#include "planner/import/onnx_import.h"
#include "planner/import/onnx_signature.h"
#include "planner/support/files.h"

namespace rannc::import {

using onnx::TensorProto;

namespace {

/// Note [weightless models]
/// An initializer may come without its contents: ONNX external data whose file
/// is absent, or dims and no data at all. Import and planning need only the
/// dims, so such a model (models/make_large.py writes 100-billion-parameter
/// ones in seconds) plans like any other; only rannc-exec needs the contents,
/// and says which are missing unless told to make them up (--init-weights).
/// External data that is present is read: `location` relative to the model's
/// folder, optional `offset` and `length` (ONNX's external data convention).

/// Why `t`'s contents cannot be read ("" when they can); `dir` is the model's folder.
std::string absentReason(const TensorProto &t, const std::filesystem::path &dir) {
  if (t.data_location() == TensorProto::EXTERNAL) {
    for (const auto &kv : t.external_data())
      if (kv.key() == "location") {
        std::error_code ec;
        if (!std::filesystem::is_regular_file(dir / kv.value(), ec))
          return "its external data file '" + kv.value() + "' does not exist";
        return "";
      }
    return "it is marked external but names no location";
  }
  if (t.has_raw_data()) return "";
  int64_t numel = 1;
  for (int64_t d : t.dims()) numel *= d;
  const int stored = t.float_data_size() + t.double_data_size() + t.int32_data_size() + t.int64_data_size();
  if (numel > 0 && stored == 0) return "it has dims but no data";
  return "";
}

} // namespace

Expected<ir::Tensor> readExternal(const TensorProto &t, const std::filesystem::path &dir, const std::string &where) {
  std::string location;
  int64_t offset = 0, length = -1;
  try {
    for (const auto &kv : t.external_data()) {
      if (kv.key() == "location") location = kv.value();
      else if (kv.key() == "offset") offset = std::stoll(kv.value());
      else if (kv.key() == "length") length = std::stoll(kv.value());
    }
  } catch (const std::exception &) {
    return Error{where + ": tensor '" + t.name() + "' has a malformed external data offset or length"};
  }
  // Inside the model's folder only (Note [hostile inputs]): no absolute path, no .., no symlink out.
  auto file = insideFolder(dir.string(), location, "tensor '" + t.name() + "': external data location");
  if (!file) return Error{where + ": " + file.error().message};
  TensorProto inline_copy = t;
  inline_copy.clear_external_data();
  inline_copy.set_data_location(TensorProto::DEFAULT);
  auto dt = dtypeFromOnnx(t.data_type());
  int64_t want = dt ? ir::dtypeSize(*dt) : 0;
  for (int64_t d : t.dims())
    if (d < 0 || __builtin_mul_overflow(want, d, &want))
      return Error{where + ": tensor '" + t.name() + "' has implausible dims"};
  if (length < 0) length = want;
  auto in = openInput(*file);
  if (!in) return Error{where + ": tensor '" + t.name() + "': " + in.error().message};
  if (offset < 0 || length < 0 || length != want || uint64_t(offset) + uint64_t(length) > in->size())
    return Error{where + ": tensor '" + t.name() + "': cannot read " + std::to_string(length) + " bytes at offset " +
                 std::to_string(offset) + " of external data file '" + *file + "' (" + std::to_string(in->size()) +
                 " bytes; the tensor's dims need " + std::to_string(want) + ")"};
  std::string bytes(size_t(length), '\0');
  if (Status st = in->readAt(uint64_t(offset), uint64_t(length), bytes.data()); !st)
    return Error{where + ": tensor '" + t.name() + "': " + st.message()};
  inline_copy.set_raw_data(std::move(bytes));
  return tensorFromOnnx(inline_copy, where);
}

Expected<std::map<std::string, ir::Tensor>> loadModelWeights(const std::string &path,
                                                             const std::vector<std::string> &names,
                                                             std::vector<MissingWeight> *missing) {
  auto bytes = readFile(path);
  if (!bytes) return bytes.error();
  onnx::ModelProto model;
  if (!model.ParseFromString(*bytes)) return Error{path + ": not a valid ONNX model"};
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (auto sig = restoreSignature(model, dir.string(), path, nullptr); !sig) return sig.error(); // as import does
  std::set<std::string> wanted(names.begin(), names.end()), seen;
  std::map<std::string, ir::Tensor> out;
  for (const auto &t : model.graph().initializer()) {
    if (!wanted.count(t.name())) continue;
    seen.insert(t.name());
    if (std::string why = absentReason(t, dir); !why.empty()) {
      if (!missing)
        return Error{path + ": initializer '" + t.name() + "' has no weight data (" + why + ")"};
      missing->push_back({t.name(), why});
      continue;
    }
    auto tensor = t.data_location() == TensorProto::EXTERNAL ? readExternal(t, dir, path) : tensorFromOnnx(t, path);
    if (!tensor) return tensor.error();
    out.emplace(t.name(), std::move(*tensor));
  }
  for (const auto &n : names)
    if (!seen.count(n)) return Error{path + ": model has no initializer named '" + n + "'"};
  return out;
}

} // namespace rannc::import
