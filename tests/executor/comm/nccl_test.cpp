#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <stdexcept>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"
#include "tests/executor/comm/mpi_world.h"

#ifdef RANNC_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace rannc::comm {
namespace {

// Host memory is all an MPI communicator reaches: a device buffer is refused
// before its pointer is read (so this needs no GPU), host floats are summed.
TEST(Comm, MpiTakesHostMemoryOnly) {
  Communicator &host = world();
  float x[2] = {1.5f, -2.0f};
  host.allReduce(Buffer::host(x, 2), ReduceOp::Sum); // one rank: the sum is the value itself
  EXPECT_EQ(x[0], 1.5f);
  EXPECT_EQ(x[1], -2.0f);
  float *nowhere = reinterpret_cast<float *>(uintptr_t{16});
  EXPECT_THROW(host.allReduce(Buffer::device(nowhere, 2), ReduceOp::Sum), std::logic_error);
  EXPECT_THROW(host.startAllGather(Buffer::device(nowhere, 2)), std::logic_error);
  EXPECT_THROW(host.recvInto(nowhere, 8, Memory::Device, 0, 0), std::logic_error);
  EXPECT_THROW(host.sendBytes(Payload{nowhere, 8, nullptr, Memory::Device}, 0, 0), std::logic_error);
}

TEST(Nccl, AllReduceAndSelfSendOnOneRank) {
  if (!ncclCompiled()) GTEST_SKIP() << "built without the CUDA toolkit";
  if (visibleCudaDevices() == 0) GTEST_SKIP() << "no GPU visible";
#ifdef RANNC_TEST_WITH_CUDA
  // The legacy default stream is the compute stream: the copies below order after the device operations.
  auto dev = createDeviceCommunicator(world().split(0, 0), 0, /*stream=*/nullptr, /*nccl=*/true);
  ASSERT_EQ(dev->size(), 1);
  std::vector<float> in{1, 2, 3, 4}, out(4, 0);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 16), cudaSuccess);
  cudaMemcpy(a, in.data(), 16, cudaMemcpyHostToDevice);
  dev->allReduce(Buffer::device(a, 4), ReduceOp::Sum); // one rank: the sum is the value itself
  cudaMemcpy(out.data(), a, 16, cudaMemcpyDeviceToHost);
  EXPECT_EQ(out, in);
  dev->groupStart(); // a send to oneself completes only together with its receive
  dev->sendBytes(Payload{a, 16, nullptr, Memory::Device}, 0, 0);
  dev->recvInto(b, 16, Memory::Device, 0, 0);
  dev->groupEnd(); // the compute stream waits for the received bytes
  dev->waitSends();
  cudaMemcpy(out.data(), b, 16, cudaMemcpyDeviceToHost);
  EXPECT_EQ(out, in);
  cudaFree(a);
  cudaFree(b);
#endif
}

// The collectives the trainer's gradient buckets and ZeRO use, on device
// memory over NCCL and staged through the host, on one rank: each leaves the
// sums (here the values themselves) where the Communicator contract says,
// and the stream order makes them visible to the next copy on `stream`.
TEST(Nccl, DeviceCollectivesOnOneRank) {
  if (!ncclCompiled()) GTEST_SKIP() << "built without the CUDA toolkit";
  if (visibleCudaDevices() == 0) GTEST_SKIP() << "no GPU visible";
#ifdef RANNC_TEST_WITH_CUDA
  ASSERT_EQ(cudaSetDevice(0), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  for (bool over_nccl : {true, false}) {
    SCOPED_TRACE(over_nccl ? "NCCL" : "staged");
    auto dc = createDeviceCommunicator(world().split(0, 0), 0, stream, over_nccl);
    std::vector<float> in{1, 2, 3, 4, 5, 6}, out(6, 0);
    float *d = nullptr;
    ASSERT_EQ(cudaMalloc(&d, 24), cudaSuccess);
    auto roundTrip = [&](auto start) {
      cudaMemcpyAsync(d, in.data(), 24, cudaMemcpyHostToDevice, stream);
      start()->wait();
      cudaMemcpyAsync(out.data(), d, 24, cudaMemcpyDeviceToHost, stream);
      cudaStreamSynchronize(stream);
      return out;
    };
    EXPECT_EQ(roundTrip([&] { return dc->startAllReduce(Buffer::device(d, 6), ReduceOp::Sum); }), in);
    EXPECT_EQ(roundTrip([&] { return dc->startReduceScatter(Buffer::device(d, 6)); }), in);
    EXPECT_EQ(roundTrip([&] { return dc->startAllGather(Buffer::device(d, 6)); }), in);
    dc->allReduce(Buffer::device(d, 6), ReduceOp::Max);
    double x = 2.5;
    dc->allReduce(&x, 1, ReduceOp::Sum); // host values go to MPI
    EXPECT_EQ(x, 2.5);
    cudaFree(d);
  }
  cudaStreamDestroy(stream);
#endif
}

TEST(Nccl, MissingDeviceIsAClearError) {
  if (visibleCudaDevices() > 0) GTEST_SKIP() << "a GPU is visible";
  try {
    createDeviceCommunicator(world().split(0, 0), 0, nullptr, /*nccl=*/true);
    FAIL() << "expected an error";
  } catch (const std::runtime_error &e) {
    std::string msg = e.what();
    EXPECT_TRUE(msg.find("not visible") != std::string::npos || msg.find("without the CUDA toolkit") != std::string::npos)
        << msg;
  }
}

} // namespace
} // namespace rannc::comm
