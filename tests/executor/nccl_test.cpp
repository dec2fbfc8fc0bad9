#include <gtest/gtest.h>

#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/device_comm.h"

#ifdef RANNC_TEST_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace rannc::comm {
namespace {

TEST(Nccl, AllReduceAndSelfSendOnOneRank) {
  if (!ncclCompiled()) GTEST_SKIP() << "built without the CUDA toolkit";
  if (visibleCudaDevices() == 0) GTEST_SKIP() << "no GPU visible";
#ifdef RANNC_TEST_WITH_CUDA
  int argc = 0;
  char **argv = nullptr;
  auto host = createMpiCommunicator(&argc, &argv); // a singleton MPI job: one rank
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

TEST(Nccl, MissingDeviceIsAClearError) {
  if (visibleCudaDevices() > 0) GTEST_SKIP() << "a GPU is visible";
  int argc = 0;
  char **argv = nullptr;
  auto host = createMpiCommunicator(&argc, &argv);
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
