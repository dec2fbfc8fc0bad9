#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
  float sample[2] = {};
  ASSERT_TRUE(a->readSample(2, reinterpret_cast<char *>(sample)).ok());
  EXPECT_EQ(sample[1], 6.0f);
  // Positions outside the file are errors, never reads past it.
  EXPECT_FALSE(a->readSample(3, reinterpret_cast<char *>(sample)).ok());
  EXPECT_FALSE(a->readSample(-1, reinterpret_cast<char *>(sample)).ok());
}

TEST(Npy, RefusesWhatIsNotARegularFile) {
  const std::string fifo = ::testing::TempDir() + "fifo.npy";
  std::remove(fifo.c_str());
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string &path : {fifo, std::string("/dev/zero"), ::testing::TempDir()}) {
    auto a = NpyArray::open(path); // returns at once: no hang on a FIFO without a writer
    ASSERT_FALSE(a.ok()) << path;
    EXPECT_NE(a.error().message.find("not a regular file"), std::string::npos) << a.error().message;
  }
  std::remove(fifo.c_str());
}

TEST(Npy, RefusesAShapeThatOverflows) {
  auto path = writeNpy("big.npy", "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904, 8), }",
                       std::string(64, '\0'));
  auto a = NpyArray::open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("truncated"), std::string::npos) << a.error().message;
}

TEST(Npy, ReportsAFileTruncatedOrChangedWhileInUse) {
  float v[6] = {1, 2, 3, 4, 5, 6};
  const std::string data(reinterpret_cast<char *>(v), sizeof v);
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }";
  auto path = writeNpy("shrink.npy", header, data);
  auto a = NpyArray::open(path);
  ASSERT_TRUE(a.ok()) << a.error().message;
  ASSERT_EQ(::truncate(path.c_str(), 64 + 8), 0); // only sample 0 is left
  EXPECT_FALSE(a->checkUnchanged().ok());
  float sample[2] = {};
  Status st = a->readSample(2, reinterpret_cast<char *>(sample)); // an error, not SIGBUS
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find(path), std::string::npos) << st.message();

  // Overwritten in place with the same size: the modification time tells.
  auto b = NpyArray::open(writeNpy("same.npy", header, data));
  ASSERT_TRUE(b.ok());
  struct timespec later[2] = {{0, UTIME_OMIT}, {1, 0}};
  ASSERT_EQ(::utimensat(AT_FDCWD, b->path().c_str(), later, 0), 0);
  Status changed = b->checkUnchanged();
  ASSERT_FALSE(changed.ok());
  EXPECT_NE(changed.message().find("modified"), std::string::npos) << changed.message();
}

TEST(Npy, RejectsTruncatedFile) {
  auto path = writeNpy("t.npy", "{'descr': '<f4', 'fortran_order': False, 'shape': (3, 2), }", std::string(8, '\0'));
  auto a = NpyArray::open(path);
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.error().message.find("truncated"), std::string::npos) << a.error().message;
}

} // namespace
} // namespace rannc::data
