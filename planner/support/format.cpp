#include "planner/support/format.h"

#include <charconv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>

namespace rannc {
namespace {

/// Binary units with `decimals` digits after the point ("%.0f B" below 1 KiB).
std::string binaryUnits(double bytes, int decimals) {
  static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  double v = bytes;
  while (std::fabs(v) >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  const int digits = u == 0 ? 0 : decimals;
  std::string out(size_t(std::snprintf(nullptr, 0, "%.*f %s", digits, v, units[u])), '\0');
  std::snprintf(out.data(), out.size() + 1, "%.*f %s", digits, v, units[u]);
  return out;
}

/// A whole number of the largest binary unit that divides it, else exact decimal digits.
std::string exactBytes(int64_t bytes) {
  if (bytes > 0) {
    static const DecimalSuffix binary[] = {{40, "TiB"}, {30, "GiB"}, {20, "MiB"}, {10, "KiB"}};
    for (const auto &b : binary)
      if (bytes % (int64_t{1} << b.exp10) == 0) return std::to_string(bytes >> b.exp10) + b.name;
  }
  static const DecimalSuffix decimal[] = {{0, "B"}, {3, "KB"}, {6, "MB"}, {9, "GB"}, {12, "TB"}};
  return formatDecimal(double(bytes), decimal, std::size(decimal));
}

} // namespace

std::string formatBytes(double bytes, ByteStyle style) {
  switch (style) {
  case ByteStyle::Short: return binaryUnits(bytes, 1);
  case ByteStyle::Long: return binaryUnits(bytes, 2);
  case ByteStyle::Exact: return exactBytes(int64_t(bytes));
  case ByteStyle::Compact: break;
  }
  const int64_t b = int64_t(bytes);
  if (b > 0 && b % (int64_t{1} << 20) == 0) return exactBytes(b);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2fGiB", double(b) / double(int64_t{1} << 30));
  return buf;
}

std::string formatDecimal(double v, const DecimalSuffix *suffixes, size_t n) {
  const DecimalSuffix *unit = suffixes;
  for (size_t i = 0; i < n; ++i)
    if (suffixes[i].exp10 == 0) unit = &suffixes[i];
  if (v == 0 || !std::isfinite(v)) {
    char buf[32];
    auto r = std::to_chars(buf, buf + sizeof buf, v);
    return std::string(buf, r.ptr) + unit->name;
  }
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, std::fabs(v), std::chars_format::scientific);
  std::string sci(buf, r.ptr); // "1.95e+13"
  size_t e = sci.find('e');
  std::string digits;
  for (size_t i = 0; i < e; ++i)
    if (sci[i] != '.') digits += sci[i];
  int x = std::atoi(sci.c_str() + e + 1);
  unit = suffixes; // the smallest, for values below every suffix
  for (size_t i = 0; i < n; ++i)
    if (suffixes[i].exp10 <= x) unit = &suffixes[i];
  int int_len = x - unit->exp10 + 1;
  std::string out = v < 0 ? "-" : "";
  if (int_len >= int(digits.size()))
    out += digits + std::string(int_len - digits.size(), '0');
  else if (int_len > 0)
    out += digits.substr(0, int_len) + "." + digits.substr(int_len);
  else
    out += "0." + std::string(-int_len, '0') + digits;
  return out + unit->name;
}

} // namespace rannc
