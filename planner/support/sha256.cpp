#include "planner/support/sha256.h"

#include <openssl/evp.h>

#include <memory>
#include <stdexcept>

namespace rannc {
namespace {

/// One SHA-256 digest through OpenSSL's EVP interface (libcrypto).
class Sha256 {
public:
  Sha256() : ctx_(EVP_MD_CTX_new(), &EVP_MD_CTX_free) {
    if (!ctx_ || EVP_DigestInit_ex(ctx_.get(), EVP_sha256(), nullptr) != 1)
      throw std::runtime_error("OpenSSL: cannot start a SHA-256 digest");
  }
  void update(const void *data, size_t n) {
    if (n && EVP_DigestUpdate(ctx_.get(), data, n) != 1) throw std::runtime_error("OpenSSL: SHA-256 update failed");
  }
  std::string hex() {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int len = 0;
    if (EVP_DigestFinal_ex(ctx_.get(), md, &len) != 1) throw std::runtime_error("OpenSSL: SHA-256 final failed");
    static constexpr char kHex[] = "0123456789abcdef";
    std::string out;
    out.reserve(2 * len);
    for (unsigned int i = 0; i < len; ++i) {
      out += kHex[md[i] >> 4];
      out += kHex[md[i] & 15];
    }
    return out;
  }

private:
  std::unique_ptr<EVP_MD_CTX, decltype(&EVP_MD_CTX_free)> ctx_;
};

} // namespace

std::string sha256Hex(std::istream &in) {
  Sha256 s;
  char buf[1 << 16];
  while (in) {
    in.read(buf, sizeof buf);
    s.update(buf, static_cast<size_t>(in.gcount()));
  }
  return s.hex();
}

std::string sha256Hex(const std::function<size_t(char *, size_t)> &read) {
  Sha256 s;
  char buf[1 << 16];
  for (size_t n; (n = read(buf, sizeof buf)) > 0;) s.update(buf, n);
  return s.hex();
}

std::string sha256Hex(std::string_view data) {
  Sha256 s;
  s.update(data.data(), data.size());
  return s.hex();
}

} // namespace rannc
