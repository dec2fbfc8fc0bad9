#include "executor/checkpoint/tensor_file.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <optional>

namespace rannc::checkpoint {
namespace {

struct DTypeName {
  ir::DType type;
  const char *name;
};
constexpr DTypeName kNames[] = {{ir::DType::F32, "F32"}, {ir::DType::F64, "F64"},   {ir::DType::F16, "F16"},
                                {ir::DType::BF16, "BF16"}, {ir::DType::I64, "I64"}, {ir::DType::I32, "I32"},
                                {ir::DType::I16, "I16"},   {ir::DType::I8, "I8"},   {ir::DType::U8, "U8"},
                                {ir::DType::Bool, "BOOL"}};

std::optional<ir::DType> parseSafetensorsDType(const std::string &s) {
  for (const auto &d : kNames)
    if (s == d.name) return d.type;
  return std::nullopt;
}

} // namespace

std::string safetensorsDType(ir::DType t) {
  for (const auto &d : kNames)
    if (d.type == t) return d.name;
  return "undefined";
}

std::string encodeTensors(const NamedTensors &tensors, const std::map<std::string, std::string> &metadata) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto &[name, t] : tensors) {
    header[name] = {{"dtype", safetensorsDType(t.dtype)},
                    {"shape", t.dims},
                    {"data_offsets", {offset, offset + uint64_t(t.data.size())}}};
    offset += t.data.size();
  }
  std::string json = header.dump();
  json.append((8 - json.size() % 8) % 8, ' '); // keeps the data 8-byte aligned
  std::string out(8, '\0');
  const uint64_t n = json.size();
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  out.reserve(8 + json.size() + offset);
  out += json;
  for (const auto &[name, t] : tensors) out += t.data;
  return out;
}

Expected<TensorFile> decodeTensors(const std::string &bytes, const std::string &where) {
  if (bytes.size() < 8) return Error{where + ": truncated tensor file (" + std::to_string(bytes.size()) + " bytes)"};
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= uint64_t(static_cast<unsigned char>(bytes[size_t(i)])) << (8 * i);
  if (n > bytes.size() - 8)
    return Error{where + ": tensor file header of " + std::to_string(n) + " bytes does not fit in the file"};
  const uint64_t data_begin = 8 + n, data_size = bytes.size() - data_begin;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes.begin() + 8, bytes.begin() + long(data_begin));
  } catch (const nlohmann::json::exception &e) {
    return Error{where + ": tensor file header is not valid JSON: " + e.what()};
  }
  if (!header.is_object()) return Error{where + ": tensor file header is not a JSON object"};
  TensorFile out;
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  try {
    for (const auto &[name, entry] : header.items()) {
      if (name == "__metadata__") {
        for (const auto &[k, v] : entry.items()) out.metadata[k] = v.get<std::string>();
        continue;
      }
      const std::string what = where + ": tensor '" + name + "'";
      auto dt = parseSafetensorsDType(entry.at("dtype").get<std::string>());
      if (!dt) return Error{what + " has unsupported dtype " + entry.at("dtype").dump()};
      ir::Tensor t;
      t.dtype = *dt;
      int64_t numel = 1;
      for (const auto &d : entry.at("shape")) {
        const int64_t v = d.get<int64_t>();
        if (v < 0 || (v != 0 && numel > (int64_t(1) << 40) / v)) return Error{what + " has an implausible shape"};
        t.dims.push_back(v);
        numel *= v;
      }
      const auto &off = entry.at("data_offsets");
      if (!off.is_array() || off.size() != 2) return Error{what + ": data_offsets must be [begin, end]"};
      const uint64_t b = off[0].get<uint64_t>(), e = off[1].get<uint64_t>();
      if (b > e || e > data_size)
        return Error{what + ": bytes [" + std::to_string(b) + ", " + std::to_string(e) + ") lie outside the " +
                     std::to_string(data_size) + " data bytes"};
      if (e - b != uint64_t(numel * ir::dtypeSize(t.dtype)))
        return Error{what + " holds " + std::to_string(e - b) + " bytes, its shape needs " +
                     std::to_string(numel * ir::dtypeSize(t.dtype))};
      t.data.assign(bytes, size_t(data_begin + b), size_t(e - b));
      ranges.emplace_back(b, e);
      out.tensors.emplace(name, std::move(t));
    }
  } catch (const nlohmann::json::exception &e) {
    return Error{where + ": malformed tensor file header: " + e.what()};
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t i = 1; i < ranges.size(); ++i)
    if (ranges[i].first < ranges[i - 1].second) return Error{where + ": tensors overlap in the file"};
  return out;
}

} // namespace rannc::checkpoint
