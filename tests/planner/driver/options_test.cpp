// rannc-plan's options functions (planner/driver/options.h): the checks the
// tool used to make itself, called in-process as tests of the verbs do.
#include <gtest/gtest.h>

#include "planner/driver/options.h"
#include "planner/driver/planner.h"
#include "planner/driver/tooling.h"

namespace rannc::planner {
namespace {

TEST(PlanOptions, ClusterFileExcludesDevicePresetFlags) {
  PlanOptions o;
  o.cluster_file = "cluster.yaml";
  PlanFlags flags;
  flags.devices_given = true;
  Status st = finishPlanOptions(flags, o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "--cluster describes the devices; do not combine it with --gpus or --device-type");
  flags.devices_given = false;
  EXPECT_TRUE(finishPlanOptions(flags, o).ok());
  o.cluster_file.clear(); // --gpus with a preset is the ordinary case
  flags.devices_given = true;
  EXPECT_TRUE(finishPlanOptions(flags, o).ok());
}

TEST(PlanOptions, DeviceMemoryBecomesBytes) {
  PlanOptions o;
  PlanFlags flags;
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_FALSE(o.device_memory.has_value()); // not given: the preset's
  flags.device_memory = "2GiB";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.device_memory, int64_t{2} << 30);
  flags.device_memory = "2XB";
  Status st = finishPlanOptions(flags, o);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message().rfind("--device-memory: '2XB': unknown size unit 'XB'", 0), 0u) << st.message();
}

TEST(PlanOptions, EnumWordsParseOnce) {
  PlanOptions o;
  PlanFlags flags;
  flags.precision = "bf16";
  flags.recompute = "on";
  flags.zero = "0";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.precision, cost::Precision::BF16);
  EXPECT_EQ(o.recompute, Recompute::On);
  EXPECT_EQ(o.zero, Zero::Off);
  flags.precision = "int8";
  EXPECT_EQ(finishPlanOptions(flags, o).message(), "--precision: precision must be fp32, bf16 or fp16 (got 'int8')");
  flags.precision = "fp32";
  flags.recompute = "maybe";
  EXPECT_EQ(finishPlanOptions(flags, o).message(), "--recompute must be auto, on or off (got 'maybe')");
  flags.recompute = "auto";
  flags.zero = "2";
  EXPECT_EQ(finishPlanOptions(flags, o).message(), "--zero must be auto, 0 or 1 (got '2')");
  // The words --help lists are the ones the parsers read, in enum order.
  const std::vector<std::string> recompute = recomputeNames(), zero = zeroNames();
  for (size_t i = 0; i < recompute.size(); ++i) EXPECT_EQ(*parseRecompute(recompute[i]), Recompute(i));
  for (size_t i = 0; i < zero.size(); ++i) EXPECT_EQ(*parseZero(zero[i]), Zero(i));
  EXPECT_EQ(cost::precisionNames(), (std::vector<std::string>{"fp32", "bf16", "fp16"}));
}

TEST(PlanOptions, ScheduleIsSearchedUnlessNamed) {
  PlanOptions o;
  PlanFlags flags;
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_FALSE(o.schedule.has_value()); // not given: the partitioner chooses
  flags.schedule = "gpipe";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.schedule, pipeline::Schedule::GPipe);
  flags.schedule = "1f1b";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.schedule, pipeline::Schedule::OneFOneB);
  flags.schedule = "zb";
  EXPECT_EQ(finishPlanOptions(flags, o).message(),
            "--schedule must be auto, gpipe, 1f1b, zb-h1, zb-h2 or interleaved-1f1b (got 'zb')");
  flags.schedule = "auto"; // the default, said (Note [schedule default]): every schedule weighed
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_FALSE(o.schedule.has_value());
  EXPECT_TRUE(o.auto_schedule);
  EXPECT_EQ(PlanFlags().schedule, "auto");
  flags.schedule.clear(); // empty: the same
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_FALSE(o.schedule.has_value());
  EXPECT_TRUE(o.auto_schedule);
  EXPECT_EQ(scheduleNames(), (std::vector<std::string>{"auto", "gpipe", "1f1b", "zb-h1", "zb-h2", "interleaved-1f1b"}));
}

TEST(PlanOptions, TensorParallelLikeReplicas) {
  PlanOptions o;
  PlanFlags flags;
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_TRUE(o.tensor_parallel.empty()); // auto: the partitioner chooses per stage
  flags.tensor_parallel = "8";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.tensor_parallel, std::vector<int>{8});
  flags.tensor_parallel = "8,8,4";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.tensor_parallel, (std::vector<int>{8, 8, 4}));
  flags.tensor_parallel = "auto";
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_TRUE(o.tensor_parallel.empty());
  for (const char *bad : {"0", "-2", "two", "8,", ",8", "8,,4", "", "1e3"}) {
    flags.tensor_parallel = bad;
    EXPECT_EQ(finishPlanOptions(flags, o).message(),
              std::string("--tensor-parallel must be auto, a degree N or one degree per stage N1,N2,... (got '") +
                  bad + "')");
  }
  // Per-stage degrees and per-stage replicas must agree on the stage count.
  flags.tensor_parallel = "2,2";
  o.replicas = {1, 2, 1};
  EXPECT_EQ(finishPlanOptions(flags, o).message(),
            "--tensor-parallel gives 2 per-stage degrees but --replicas 3 per-stage counts");
  o.replicas = {1, 2};
  EXPECT_TRUE(finishPlanOptions(flags, o).ok());
}

TEST(PlanOptions, OptimizerSetsTheStateTheEstimateCounts) {
  PlanOptions o;
  PlanFlags flags;
  ASSERT_TRUE(finishPlanOptions(flags, o).ok());
  EXPECT_EQ(o.optimizer, cost::Optimizer::Adam); // the default memory estimate
  const std::pair<const char *, double> want[] = {{"sgd", 0}, {"momentum", 1}, {"adam", 2}, {"adamw", 2}};
  for (const auto &[word, factor] : want) {
    flags.optimizer = word;
    ASSERT_TRUE(finishPlanOptions(flags, o).ok()) << word;
    EXPECT_EQ(cost::optimizerName(o.optimizer), std::string(word));
    EXPECT_EQ(cost::optimizerStateFactor(o.optimizer), factor) << word;
  }
  flags.optimizer = "lion";
  EXPECT_EQ(finishPlanOptions(flags, o).message(), "--optimizer must be sgd, momentum, adam or adamw (got 'lion')");
}

TEST(PlanOptions, ProfileBatchSizesPrecisionAndDevice) {
  ProfileCommandOptions o;
  ASSERT_TRUE(finishProfileOptions({"fp16", "cuda"}, o).ok());
  EXPECT_EQ(o.precision, cost::Precision::FP16);
  EXPECT_EQ(o.device, cluster::DeviceKind::Cuda);
  ASSERT_TRUE(finishProfileOptions({"fp16", "cpu"}, o).ok());
  EXPECT_EQ(o.device, cluster::DeviceKind::Cpu);
  EXPECT_EQ(finishProfileOptions({"fp32", "tpu"}, o).message(), "--device must be cpu or cuda (got 'tpu')");
  EXPECT_EQ(cluster::deviceKindNames(), (std::vector<std::string>{"cpu", "cuda"}));
  o.batch_sizes = {0, 1};
  EXPECT_EQ(finishProfileOptions({"fp32", "cpu"}, o).message(), "--batch-sizes: sizes must be at least 1");
  o.batch_sizes = {1};
  EXPECT_FALSE(finishProfileOptions({"fp64", "cpu"}, o).ok());
  EXPECT_EQ(finishProfileOptions({"fp32", "cpu", "momentum"}, o).message(),
            "--optimizer must be sgd or adam (got 'momentum')");
  ASSERT_TRUE(finishProfileOptions({"fp32", "cpu", "sgd"}, o).ok());
  EXPECT_EQ(o.optimizer, cost::Optimizer::Sgd);
}

TEST(PlanOptions, ReestimateMarginAndMemory) {
  ReestimateOptions o;
  ASSERT_TRUE(finishReestimateOptions("", -1, o).ok());
  EXPECT_FALSE(o.memory_margin.has_value()); // the plan's own
  EXPECT_FALSE(o.device_memory.has_value());
  ASSERT_TRUE(finishReestimateOptions("512MiB", 0.2, o).ok());
  EXPECT_EQ(o.memory_margin, 0.2);
  EXPECT_EQ(o.device_memory, int64_t{512} << 20);
  EXPECT_FALSE(finishReestimateOptions("lots", 0.2, o).ok());
}

} // namespace
} // namespace rannc::planner
