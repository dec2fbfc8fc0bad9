// SHA-256 (OpenSSL's libcrypto): the plan names its model file by content hash.
#pragma once

#include <functional>
#include <istream>
#include <string>
#include <string_view>

namespace rannc {

/// Lowercase hex SHA-256 of everything readable from `in`.
std::string sha256Hex(std::istream &in);
/// Lowercase hex SHA-256 of the bytes `read` yields (it fills up to n bytes, returns 0 at the end).
std::string sha256Hex(const std::function<size_t(char *, size_t)> &read);
/// Lowercase hex SHA-256 of `data`.
std::string sha256Hex(std::string_view data);

} // namespace rannc
