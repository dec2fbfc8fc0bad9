// rannc-exec's options function (executor/train/options.h): the unit and
// text conversions the tool used to make itself, called in-process.
#include <gtest/gtest.h>

#include "executor/train/options.h"
#include "executor/train/trainer.h"

namespace rannc::train {
namespace {

TEST(ExecOptions, BetasAreTwoNumbersAndNothingElse) {
  auto ok = parseBetas("0.8,0.99");
  ASSERT_TRUE(ok.ok());
  EXPECT_EQ(ok->first, 0.8);
  EXPECT_EQ(ok->second, 0.99);
  for (const char *bad : {"0.9", "0.9,", ",0.9", "0.9,0.99x", "a,b", "0.9;0.99", ""})
    EXPECT_FALSE(parseBetas(bad).ok()) << bad;
  EXPECT_EQ(parseBetas("0.9").error().message, "'0.9' is not two numbers B1,B2 (e.g. 0.9,0.999)");
}

TEST(ExecOptions, FlagsBecomeTrainOptions) {
  TrainOptions o;
  ExecFlags flags;
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.bucket_bytes, 25 << 20); // the default, as TrainOptions's own
  EXPECT_FALSE(o.host_staged);
  EXPECT_FALSE(o.betas.has_value());
  flags.bucket_mib = 0.5;
  flags.gpu_transport = "host";
  flags.betas = "0.5,0.75";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.bucket_bytes, 1 << 19);
  EXPECT_TRUE(o.host_staged);
  EXPECT_EQ(o.betas, std::make_pair(0.5, 0.75));
  EXPECT_EQ(bucketBytes(1e-9), 1); // never an empty bucket
  flags.betas = "0.5";
  EXPECT_EQ(finishTrainOptions(flags, o).message(), "--betas: '0.5' is not two numbers B1,B2 (e.g. 0.9,0.999)");
  flags.betas.reset();
  flags.gpu_transport = "carrier-pigeon";
  EXPECT_FALSE(finishTrainOptions(flags, o).ok());
}

// --gpu-transport rehearsal, with RANNC_REHEARSAL's hooks (Note [rehearsal]).
TEST(ExecOptions, RehearsalAndItsHooks) {
  TrainOptions o;
  ExecFlags flags;
  flags.gpu_transport = "rehearsal";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  ASSERT_TRUE(o.rehearsal.has_value());
  EXPECT_EQ(o.rehearsal->stall_s, 60);
  EXPECT_EQ(o.rehearsal->swap_rank, -1);
  flags.rehearsal = "stall=2.5,swap=1:3";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.rehearsal->stall_s, 2.5);
  EXPECT_EQ(o.rehearsal->swap_rank, 1);
  EXPECT_EQ(o.rehearsal->swap_call, 3);
  flags.rehearsal = "swap=1";
  EXPECT_EQ(finishTrainOptions(flags, o).message(),
            "RANNC_REHEARSAL: 'swap=1' is neither stall=SECONDS nor swap=RANK:CALL");
  flags.gpu_transport = "nccl"; // the hooks only matter to a rehearsal
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_FALSE(o.rehearsal.has_value());
}

// Each enum flag: the word sets TrainOptions's value, every value's word
// parses back to it, and another word is refused with the flag's message.
TEST(ExecOptions, EnumFlagsParseOnceWithTheirWords) {
  TrainOptions o;
  ExecFlags flags;
  flags.shuffle = "on";
  flags.optimizer = "adamw";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.shuffle, Shuffle::On);
  EXPECT_EQ(o.optimizer, OptimizerKind::AdamW);
  for (Shuffle s : {Shuffle::Off, Shuffle::On}) EXPECT_EQ(*parseShuffle(shuffleName(s)), s);
  for (OptimizerKind k : {OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW})
    EXPECT_EQ(*parseOptimizer(optimizerName(k)), k);
  EXPECT_EQ(shuffleName(Shuffle::Off), "off"); // what checkpoint manifests hold
  flags.optimizer = "lion";
  EXPECT_EQ(finishTrainOptions(flags, o).message(), "--optimizer lion: unknown (sgd, adam or adamw)");
  flags.optimizer = "sgd";
  flags.shuffle = "sometimes";
  EXPECT_EQ(finishTrainOptions(flags, o).message(), "--shuffle must be on or off (got 'sometimes')");
}

TEST(ExecOptions, DeviceIsThePlansUnlessGiven) {
  TrainOptions o;
  ExecFlags flags;
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_FALSE(o.device.has_value()); // not given: the plan's device
  flags.device = "cuda";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.device, cluster::DeviceKind::Cuda);
  flags.device = "cpu";
  ASSERT_TRUE(finishTrainOptions(flags, o).ok());
  EXPECT_EQ(o.device, cluster::DeviceKind::Cpu);
  flags.device = "gpu";
  EXPECT_EQ(finishTrainOptions(flags, o).message(), "--device must be cpu or cuda (got 'gpu')");
}

} // namespace
} // namespace rannc::train
