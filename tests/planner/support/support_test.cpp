#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <sstream>
#include <string>

#include "planner/support/files.h"
#include "planner/support/format.h"
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

// One byte formatter, four styles: each is the text its readers saw before
// the formatters were merged (show's tables, the partitioner's messages,
// cluster files, the cluster summary).
TEST(Format, ByteStyles) {
  const double gib = double(int64_t{1} << 30);
  EXPECT_EQ(formatBytes(1.5 * gib, ByteStyle::Short), "1.5 GiB");
  EXPECT_EQ(formatBytes(1.5 * gib, ByteStyle::Long), "1.50 GiB");
  EXPECT_EQ(formatBytes(1023.6, ByteStyle::Short), "1024 B"); // rounded, still below one KiB
  EXPECT_EQ(formatBytes(-2048, ByteStyle::Long), "-2.00 KiB");
  EXPECT_EQ(formatBytes(5000 * gib * 1024, ByteStyle::Short), "5000.0 TiB"); // no unit above TiB
  EXPECT_EQ(formatBytes(40 * gib, ByteStyle::Exact), "40GiB");
  EXPECT_EQ(formatBytes(double(int64_t{3} << 29), ByteStyle::Exact), "1536MiB");
  EXPECT_EQ(formatBytes(33752120768, ByteStyle::Exact), "33.752120768GB");
  EXPECT_EQ(formatBytes(7, ByteStyle::Exact), "7B");
  EXPECT_EQ(formatBytes(double(int64_t{1536} << 20), ByteStyle::Compact), "1536MiB");
  EXPECT_EQ(formatBytes(33752120768, ByteStyle::Compact), "31.43GiB");
}

TEST(Format, DecimalsAreExact) {
  static const DecimalSuffix flops[] = {{0, ""}, {3, "k"}, {6, "M"}, {9, "G"}, {12, "T"}};
  EXPECT_EQ(formatDecimal(19.5e12, flops, std::size(flops)), "19.5T");
  EXPECT_EQ(formatDecimal(0.25, flops, std::size(flops)), "0.25");
  EXPECT_EQ(formatDecimal(-1500, flops, std::size(flops)), "-1.5k");
}

} // namespace
} // namespace rannc

namespace rannc {
namespace {

// Note [hostile inputs]: a FIFO, a device or a folder is refused at once.
TEST(Files, ReadsOnlyRegularFiles) {
  const std::string dir = ::testing::TempDir() + "files_test";
  std::filesystem::create_directories(dir);
  const std::string fifo = dir + "/fifo";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string &path : {fifo, std::string("/dev/zero"), dir}) {
    auto r = readFile(path);
    ASSERT_FALSE(r.ok()) << path;
    EXPECT_NE(r.error().message.find("not a regular file"), std::string::npos) << r.error().message;
    EXPECT_FALSE(hashFile(path).ok()) << path;
  }
  std::ofstream(dir + "/ten") << "0123456789";
  EXPECT_EQ(*readFile(dir + "/ten"), "0123456789");
  EXPECT_EQ(*hashFile(dir + "/ten"), sha256Hex(std::string_view("0123456789")));
  auto limited = readFile(dir + "/ten", 9); // bounded before anything is read
  ASSERT_FALSE(limited.ok());
  EXPECT_NE(limited.error().message.find("more than the 9"), std::string::npos) << limited.error().message;
}

TEST(Files, PathsStayInsideTheFolder) {
  const std::string dir = ::testing::TempDir() + "inside_test";
  std::filesystem::create_directories(dir + "/sub");
  std::ofstream(dir + "/sub/w.bin") << "w";
  std::error_code ec;
  std::filesystem::remove(dir + "/out", ec);
  std::filesystem::create_symlink("/etc", dir + "/out");
  EXPECT_EQ(*insideFolder(dir, "sub/w.bin", "location"), dir + "/sub/w.bin");
  EXPECT_TRUE(insideFolder(dir, "sub/../sub/w.bin", "location").ok());
  for (const char *bad : {"../../../../etc/passwd", "sub/../../x", "/etc/passwd", "out/passwd", ""}) {
    auto r = insideFolder(dir, bad, "location");
    EXPECT_FALSE(r.ok()) << bad;
  }
}

} // namespace
} // namespace rannc
