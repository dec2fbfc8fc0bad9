// NumPy .npy files (format versions 1-3, C order, little-endian), the
// training-data format of SPEC.md. The file is memory-mapped, so datasets
// larger than memory work and a rank touches only the samples it reads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "planner/ir/ir.h"
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
  /// Pointer to sample i's bytes.
  const char *sample(int64_t i) const { return data_ + i * sample_bytes_; }

private:
  struct Mapping;
  std::shared_ptr<Mapping> map_;
  const char *data_ = nullptr;
  ir::DType dtype_ = ir::DType::Undefined;
  std::vector<int64_t> shape_;
  int64_t sample_bytes_ = 0;
};

/// Parses an .npy header dictionary, e.g. "{'descr': '<f4', 'fortran_order':
/// False, 'shape': (64, 16), }"; exposed for tests.
Status parseNpyHeader(const std::string &header, ir::DType &dtype, std::vector<int64_t> &shape);

} // namespace rannc::data
