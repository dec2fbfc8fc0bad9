#include "executor/data/npy.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rannc::data {

namespace {

/// The value of `key` in the header dict, up to the next top-level comma.
std::string field(const std::string &header, const std::string &key) {
  auto k = header.find("'" + key + "'");
  if (k == std::string::npos) return "";
  auto colon = header.find(':', k);
  if (colon == std::string::npos) return "";
  size_t start = colon + 1, depth = 0, i = start;
  for (; i < header.size(); ++i) {
    char c = header[i];
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if ((c == ',' || c == '}') && depth == 0) break;
  }
  std::string v = header.substr(start, i - start);
  auto b = v.find_first_not_of(" \t"), e = v.find_last_not_of(" \t");
  return b == std::string::npos ? "" : v.substr(b, e - b + 1);
}

} // namespace

Status parseNpyHeader(const std::string &header, ir::DType &dtype, std::vector<int64_t> &shape) {
  std::string descr = field(header, "descr");
  struct D { const char *s; ir::DType t; };
  const D types[] = {{"'<f4'", ir::DType::F32}, {"'<f8'", ir::DType::F64}, {"'<f2'", ir::DType::F16},
                     {"'<i8'", ir::DType::I64}, {"'<i4'", ir::DType::I32}, {"'<i2'", ir::DType::I16},
                     {"'|i1'", ir::DType::I8},  {"'|u1'", ir::DType::U8},  {"'|b1'", ir::DType::Bool}};
  dtype = ir::DType::Undefined;
  for (const auto &t : types)
    if (descr == t.s) dtype = t.t;
  if (dtype == ir::DType::Undefined) return Error{"unsupported dtype " + descr + " (use little-endian numeric types)"};
  if (field(header, "fortran_order") != "False") return Error{"Fortran-order arrays are not supported"};
  std::string s = field(header, "shape");
  if (s.size() < 2 || s.front() != '(' || s.back() != ')') return Error{"bad shape field '" + s + "'"};
  shape.clear();
  std::string body = s.substr(1, s.size() - 2);
  size_t pos = 0;
  while (pos < body.size()) {
    size_t comma = body.find(',', pos);
    std::string item = body.substr(pos, comma == std::string::npos ? std::string::npos : comma - pos);
    if (item.find_first_not_of(" ") != std::string::npos) {
      try {
        shape.push_back(std::stoll(item));
      } catch (const std::exception &) {
        return Error{"bad shape field '" + s + "'"};
      }
    }
    if (comma == std::string::npos) break;
    pos = comma + 1;
  }
  return Status::success();
}

Expected<NpyArray> NpyArray::open(const std::string &path) {
  auto file = openInput(path);
  if (!file) return file.error();
  const uint64_t length = file->size();
  char pre[12] = {};
  if (length < 10 || !file->readAt(0, std::min<uint64_t>(length, 12), pre))
    return Error{path + ": not a .npy file (too short)"};
  if (std::memcmp(pre, "\x93NUMPY", 6) != 0) return Error{path + ": not a .npy file (bad magic)"};
  uint8_t major = static_cast<uint8_t>(pre[6]);
  uint64_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = uint8_t(pre[8]) | (uint64_t(uint8_t(pre[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (length < 12) return Error{path + ": truncated .npy header"};
    header_len = uint8_t(pre[8]) | (uint64_t(uint8_t(pre[9])) << 8) | (uint64_t(uint8_t(pre[10])) << 16) |
                 (uint64_t(uint8_t(pre[11])) << 24);
    header_start = 12;
  } else {
    return Error{path + ": unsupported .npy format version " + std::to_string(major)};
  }
  // NumPy writes headers of a few hundred bytes; a bigger one is not a data file.
  constexpr uint64_t kMaxHeader = 1 << 20;
  if (header_len > kMaxHeader) return Error{path + ": .npy header of " + std::to_string(header_len) + " bytes"};
  if (header_start + header_len > length) return Error{path + ": truncated .npy header"};
  std::string header(size_t(header_len), '\0');
  if (Status st = file->readAt(header_start, header_len, header.data()); !st) return Error{st.message()};
  NpyArray a;
  if (Status s = parseNpyHeader(header, a.dtype_, a.shape_); !s) return Error{path + ": " + s.message()};
  // Overflow-checked: a shape whose bytes exceed the file is refused, not wrapped.
  const uint64_t data_bytes = length - header_start - header_len;
  uint64_t sample = uint64_t(ir::dtypeSize(a.dtype_)), need = 0;
  bool overflow = false;
  for (size_t i = 0; i < a.shape_.size(); ++i) {
    if (a.shape_[i] < 0) return Error{path + ": negative dimension in shape"};
    if (i > 0) overflow = overflow || __builtin_mul_overflow(sample, uint64_t(a.shape_[i]), &sample);
  }
  overflow = overflow || __builtin_mul_overflow(uint64_t(a.samples()), sample, &need);
  if (overflow || need > data_bytes)
    return Error{path + ": file is truncated (" + std::to_string(data_bytes) + " data bytes, shape needs " +
                 (overflow ? std::string("more than 2^64") : std::to_string(need)) + ")"};
  if (a.samples() < 1) return Error{path + ": holds no samples"};
  a.sample_bytes_ = int64_t(sample);
  a.data_offset_ = header_start + header_len;
  a.file_ = std::make_shared<InputFile>(std::move(*file));
  return a;
}

Status NpyArray::readSample(int64_t i, char *out) const {
  if (i < 0 || i >= samples())
    return Error{path() + ": sample " + std::to_string(i) + " is outside its " + std::to_string(samples()) + " samples"};
  if (Status st = file_->readAt(data_offset_ + uint64_t(i) * uint64_t(sample_bytes_), uint64_t(sample_bytes_), out); !st)
    return Error{st.message()};
  return Status::success();
}

} // namespace rannc::data
