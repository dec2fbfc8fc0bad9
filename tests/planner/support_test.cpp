#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "planner/support/sha256.h"

namespace rannc {
namespace {

// FIPS 180-2, appendix B: the one-block and two-block messages.
TEST(Sha256, FipsVectors) {
  EXPECT_EQ(sha256Hex(std::string_view("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256Hex(std::string_view("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  EXPECT_EQ(sha256Hex(std::string_view("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

// The stream form reads in 64 KiB pieces: a message across several pieces
// hashes as the whole.
TEST(Sha256, StreamEqualsWhole) {
  std::string big(200000, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = char(i * 131 % 251);
  std::istringstream in(big);
  EXPECT_EQ(sha256Hex(in), sha256Hex(std::string_view(big)));
}

} // namespace
} // namespace rannc
