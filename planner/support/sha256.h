// SHA-256 (OpenSSL's libcrypto): the plan names its model file by content hash.
#pragma once

#include <istream>
#include <string>
#include <string_view>

namespace rannc {

/// Lowercase hex SHA-256 of everything readable from `in`.
std::string sha256Hex(std::istream &in);
/// Lowercase hex SHA-256 of `data`.
std::string sha256Hex(std::string_view data);

} // namespace rannc
