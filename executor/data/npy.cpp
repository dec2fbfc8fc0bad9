#include "executor/data/npy.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace rannc::data {

struct NpyArray::Mapping {
  void *addr = MAP_FAILED;
  size_t length = 0;
  ~Mapping() {
    if (addr != MAP_FAILED) ::munmap(addr, length);
  }
};

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
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return Error{path + ": cannot open: " + std::strerror(errno)};
  struct stat st {};
  ::fstat(fd, &st);
  auto map = std::make_shared<Mapping>();
  map->length = static_cast<size_t>(st.st_size);
  if (map->length > 0) map->addr = ::mmap(nullptr, map->length, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (map->length < 10 || map->addr == MAP_FAILED) return Error{path + ": not a .npy file (too short)"};
  const char *base = static_cast<const char *>(map->addr);
  if (std::memcmp(base, "\x93NUMPY", 6) != 0) return Error{path + ": not a .npy file (bad magic)"};
  uint8_t major = static_cast<uint8_t>(base[6]);
  size_t header_len = 0, header_start = 0;
  if (major == 1) {
    header_len = uint8_t(base[8]) | (size_t(uint8_t(base[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (map->length < 12) return Error{path + ": truncated .npy header"};
    header_len = uint8_t(base[8]) | (size_t(uint8_t(base[9])) << 8) | (size_t(uint8_t(base[10])) << 16) |
                 (size_t(uint8_t(base[11])) << 24);
    header_start = 12;
  } else {
    return Error{path + ": unsupported .npy format version " + std::to_string(major)};
  }
  if (header_start + header_len > map->length) return Error{path + ": truncated .npy header"};
  NpyArray a;
  if (Status s = parseNpyHeader(std::string(base + header_start, header_len), a.dtype_, a.shape_); !s)
    return Error{path + ": " + s.message()};
  a.sample_bytes_ = ir::dtypeSize(a.dtype_);
  for (size_t i = 1; i < a.shape_.size(); ++i) a.sample_bytes_ *= a.shape_[i];
  size_t need = size_t(a.samples()) * size_t(a.sample_bytes_);
  if (header_start + header_len + need > map->length)
    return Error{path + ": file is truncated (" + std::to_string(map->length - header_start - header_len) +
                 " data bytes, shape needs " + std::to_string(need) + ")"};
  if (a.samples() < 1) return Error{path + ": holds no samples"};
  a.data_ = base + header_start + header_len;
  a.map_ = std::move(map);
  return a;
}

} // namespace rannc::data
