#include <gtest/gtest.h>
#include <torch/torch.h>

#include <map>
#include <string>

#include "executor/runtime/device.h"

namespace rannc::runtime {
namespace {

/// An environment of the given variables only.
auto envOf(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const char *name) -> const char * {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

TEST(ChooseGpu, LaunchersLocalRankInOrder) {
  EXPECT_EQ(launcherLocalRank(envOf({})), -1);
  EXPECT_EQ(launcherLocalRank(envOf({{"LOCAL_RANK", "2"}})), 2);
  EXPECT_EQ(launcherLocalRank(envOf({{"SLURM_LOCALID", "5"}, {"LOCAL_RANK", "2"}})), 5);
  EXPECT_EQ(launcherLocalRank(envOf({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"SLURM_LOCALID", "5"}})), 1);
  EXPECT_EQ(launcherLocalRank(envOf({{"MPI_LOCALRANKID", "3"}})), 3);
  // Not a number: ignored, the next launcher's is read.
  EXPECT_EQ(launcherLocalRank(envOf({{"OMPI_COMM_WORLD_LOCAL_RANK", "x"}, {"SLURM_LOCALID", "4"}})), 4);
  EXPECT_EQ(launcherLocalRank(envOf({{"SLURM_LOCALID", ""}})), -1);
}

TEST(ChooseGpu, LocalRankModVisibleDevices) {
  // 8 ranks per node, 8 GPUs: rank 13 on the second node has local rank 5.
  GpuChoice c = chooseGpu(13, 8, 8, envOf({{"OMPI_COMM_WORLD_LOCAL_RANK", "5"}}));
  EXPECT_EQ(c.device, 5);
  EXPECT_NE(c.why.find("local rank 5"), std::string::npos) << c.why;
  // Two ranks sharing one GPU both take device 0.
  EXPECT_EQ(chooseGpu(1, 2, 1, envOf({{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}})).device, 0);
  // CUDA_VISIBLE_DEVICES leaves each rank one GPU: device 0.
  EXPECT_EQ(chooseGpu(3, 4, 1, envOf({{"SLURM_LOCALID", "3"}})).device, 0);
}

TEST(ChooseGpu, PlanPlacementWithoutALauncher) {
  // Rank r is device r mod devices_per_node of its node, mod the visible ones.
  EXPECT_EQ(chooseGpu(5, 4, 4, envOf({})).device, 1);
  EXPECT_EQ(chooseGpu(7, 8, 4, envOf({})).device, 3);
  GpuChoice c = chooseGpu(6, 8, 4, envOf({}));
  EXPECT_EQ(c.device, 2);
  EXPECT_NE(c.why.find("plan's device 6"), std::string::npos) << c.why;
}

TEST(GpuMemory, TheCachingAllocatorCountsATensor) {
  if (visibleGpus() == 0) GTEST_SKIP() << "no GPU visible";
  const int64_t before = gpuAllocatedBytes(0);
  resetGpuPeak(0);
  {
    torch::Tensor t = torch::empty({1 << 20}, torch::TensorOptions(torch::kFloat).device(torch::kCUDA, 0));
    EXPECT_GE(gpuAllocatedBytes(0) - before, int64_t(4) << 20);
    EXPECT_GE(gpuReservedBytes(0), gpuAllocatedBytes(0));
  }
  EXPECT_EQ(gpuAllocatedBytes(0), before);
  EXPECT_GE(gpuPeakAllocatedBytes(0) - before, int64_t(4) << 20);
}

TEST(GpuMemory, NothingCountedWithoutAGpu) {
  if (visibleGpus() > 0) GTEST_SKIP() << "a GPU is visible";
  EXPECT_EQ(gpuAllocatedBytes(0), 0);
  EXPECT_EQ(gpuPeakAllocatedBytes(0), 0);
  EXPECT_EQ(currentGpuStream(0), nullptr);
  // What rannc-exec --device cuda and rannc-plan profile --device cuda say.
  EXPECT_NE(gpuUnavailableReason(0), "");
}

} // namespace
} // namespace rannc::runtime
