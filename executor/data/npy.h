// NumPy .npy files (format versions 1-3, C order, little-endian), the
// training-data format of SPEC.md. Samples are read from the open file on
// demand (not memory-mapped: a file truncated under a mapping kills the rank
// with SIGBUS), so datasets larger than memory work, a rank reads only the
// samples it uses, and a file that shrinks or changes is an error naming it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
#include "planner/support/files.h"
#include "planner/support/status.h"

namespace rannc::data {

class NpyArray {
public:
  static Expected<NpyArray> open(const std::string &path);

  ir::DType dtype() const { return dtype_; }
  const std::vector<int64_t> &shape() const { return shape_; }
  /// Number of samples (the first dimension).
  int64_t samples() const { return shape_.empty() ? 1 : shape_[0]; }
  /// Bytes of one sample (the product of the other dimensions times the element size).
  int64_t sampleBytes() const { return sample_bytes_; }
  /// Copies sample i's sampleBytes() bytes to `out`; i outside [0, samples()) is an error.
  Status readSample(int64_t i, char *out) const;
  /// Whether the file is still the one opened (size, modification time, identity).
  Status checkUnchanged() const { return file_->checkUnchanged(); }
  const std::string &path() const { return file_->path(); }

private:
  std::shared_ptr<InputFile> file_;
  uint64_t data_offset_ = 0;
  ir::DType dtype_ = ir::DType::Undefined;
  std::vector<int64_t> shape_;
  int64_t sample_bytes_ = 0;
};

/// Parses an .npy header dictionary, e.g. "{'descr': '<f4', 'fortran_order':
/// False, 'shape': (64, 16), }"; exposed for tests.
Status parseNpyHeader(const std::string &header, ir::DType &dtype, std::vector<int64_t> &shape);

} // namespace rannc::data
