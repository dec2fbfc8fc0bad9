#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "executor/data/npy.h"

namespace rannc::data {
namespace {

TEST(Npy, ParsesHeader) {
  ir::DType t;
  std::vector<int64_t> shape;
  ASSERT_TRUE(parseNpyHeader("{'descr': '<i8', 'fortran_order': False, 'shape': (64, 16), }", t, shape).ok());
  EXPECT_EQ(t, ir::DType::I64);
  EXPECT_EQ(shape, (std::vector<int64_t>{64, 16}));
  ASSERT_TRUE(parseNpyHeader("{'descr': '<f4', 'fortran_order': False, 'shape': (5,), }", t, shape).ok());
  EXPECT_EQ(shape, std::vector<int64_t>{5});
  EXPECT_FALSE(parseNpyHeader("{'descr': '>f4', 'fortran_order': False, 'shape': (5,), }", t, shape).ok());
  EXPECT_FALSE(parseNpyHeader("{'descr': '<f4', 'fortran_order': True, 'shape': (5,), }", t, shape).ok());
}

std::string writeNpy(const std::string &name, const std::string &header, const std::string &data) {
  std::string path = ::testing::TempDir() + name;
  std::string h = header;
  while ((10 + h.size() + 1) % 64 != 0) h += ' ';
  h += '\n';
  std::ofstream f(path, std::ios::binary);
  f.write("\x93NUMPY\x01\x00", 8);
  char len[2] = {char(h.size() & 0xff), char(h.size() >> 8)};
  f.write(len, 2);
  f << h << data;
  return path;
}

TEST(Npy, ReadsSamples) {
  float v[6] = {1, 2, 3, 4, 5, 6};
  auto path = writeNpy("a.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }",
                       std::string(reinterpret_cast<char *>(v), sizeof v));
  auto a = NpyArray::open(path);
  ASSERT_TRUE(a.ok()) << a.error().message;
  EXPECT_EQ(a->samples(), 3);
  EXPECT_EQ(a->sampleBytes(), 8);
  EXPECT_EQ(reinterpret_cast<const float *>(a->sample(2))[1], 6.0f);
}

TEST(Npy, RejectsTruncatedFile) {
  auto path = writeNpy("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", std::string(8, '\0'));
  auto a = NpyArray::open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("truncated"), std::string::npos) << a.error().message;
}

} // namespace
} // namespace rannc::data
