// Numbers as people read them: byte sizes in each style the tools print, and
// exact decimals with a unit suffix (cluster files, FLOP/s, bandwidths).
#pragma once

#include <cstddef>
#include <string>

namespace rannc {

/// How formatBytes writes a size; each style is what its readers already see.
enum class ByteStyle {
  Short,   ///< "1.5 GiB", "512 B": binary units, one decimal (rannc-plan show, diff, dot, check)
  Long,    ///< "1.50 GiB": binary units, two decimals (the partitioner's problems and messages)
  Exact,   ///< "40GiB", "1536MiB", "33.752120768GB": exact, as cluster files write sizes (parseByteSize reads it)
  Compact, ///< Exact for whole MiB, else GiB to two decimals, "1.23GiB" (the cluster summary)
};

/// `bytes` in `style`. Exact and Compact take a whole number of bytes (every
/// int64 size the tools hold converts to double and back unchanged).
std::string formatBytes(double bytes, ByteStyle style);

/// A unit suffix for formatDecimal: the power of ten it stands for, and its name.
struct DecimalSuffix {
  int exp10;
  const char *name;
};

/// `v` as decimal digits with the largest suffix whose power of ten it reaches
/// ("19.5T", "5us"). Exact: the shortest digits that round-trip, with the
/// decimal point moved, never a division.
std::string formatDecimal(double v, const DecimalSuffix *suffixes, size_t n);

} // namespace rannc
