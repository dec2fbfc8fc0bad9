#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"

#ifdef RANNC_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace rannc::comm {
namespace {

/// A singleton MPI job (one rank), initialized once per process and
/// finalized at exit: every test shares it.
Communicator &world() {
  static std::unique_ptr<Communicator> c = [] {
    int argc = 0;
    char **argv = nullptr;
    return createMpiCommunicator(&argc, &argv);
  }();
  return *c;
}

TEST(Nccl, AllReduceAndSelfSendOnOneRank) {
  if (!ncclCompiled()) GTEST_SKIP() << "built without the CUDA toolkit";
  if (visibleCudaDevices() == 0) GTEST_SKIP() << "no GPU visible";
#ifdef RANNC_TEST_WITH_CUDA
  Communicator *host = &world();
  auto dev = createNcclCommunicator(*host, 0);
  ASSERT_EQ(dev->size(), 1);
  std::vector<float> in{1, 2, 3, 4}, out(4, 0);
  float *a = nullptr, *b = nullptr;
  ASSERT_EQ(cudaMalloc(&a, 16), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&b, 16), cudaSuccess);
  cudaMemcpy(a, in.data(), 16, cudaMemcpyHostToDevice);
  dev->allReduceSum(a, 4); // one rank: the sum is the value itself
  dev->synchronize();
  cudaMemcpy(out.data(), a, 16, cudaMemcpyDeviceToHost);
  EXPECT_EQ(out, in);
  dev->groupStart(); // a send to oneself completes only together with its receive
  dev->send(a, 16, 0);
  dev->recv(b, 16, 0);
  dev->groupEnd();
  dev->synchronize();
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
    auto host = world().split(0, 0);
    std::unique_ptr<DeviceCommunicator> nccl = over_nccl ? createNcclCommunicator(*host, 0) : nullptr;
    auto dc = deviceCollectives(std::move(host), std::move(nccl), stream);
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
    EXPECT_EQ(roundTrip([&] { return dc->startAllReduce(d, 6, ReduceOp::Sum); }), in);
    EXPECT_EQ(roundTrip([&] { return dc->startReduceScatter(d, 6); }), in);
    EXPECT_EQ(roundTrip([&] { return dc->startAllGather(d, 6); }), in);
    dc->allReduce(d, 6, ReduceOp::Max);
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
  Communicator *host = &world();
  try {
    createNcclCommunicator(*host, 0);
    FAIL() << "expected an error";
  } catch (const std::runtime_error &e) {
    std::string msg = e.what();
    EXPECT_TRUE(msg.find("not visible") != std::string::npos || msg.find("without the CUDA toolkit") != std::string::npos)
        << msg;
  }
}

} // namespace
} // namespace rannc::comm
