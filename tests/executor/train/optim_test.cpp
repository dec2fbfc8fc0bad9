// The optimizer side of rannc-exec without MPI: schedule factors, clipping
// arithmetic, optimizer construction and option checks. The integration tests
// (train_check.py --variant) compare whole training runs with torch.optim.
#include <gtest/gtest.h>

#include <cmath>

#include "executor/train/loss_scale.h"
#include "executor/train/optim.h"

namespace rannc::train {
namespace {

TrainOptions withSchedule(const std::string &kind, int64_t warmup, std::optional<double> min_lr = std::nullopt) {
  TrainOptions o;
  o.lr = 0.5;
  o.lr_schedule = kind;
  o.warmup_steps = warmup;
  o.min_lr = min_lr;
  return o;
}

TEST(LrSchedule, WarmUpFromZeroThenConstant) {
  TrainOptions o = withSchedule("constant", 4);
  EXPECT_DOUBLE_EQ(lrFactor(o, 0, 10), 0.0);  // 0/4
  EXPECT_DOUBLE_EQ(lrFactor(o, 2, 10), 0.5);  // 2/4
  EXPECT_DOUBLE_EQ(lrFactor(o, 4, 10), 1.0);
  EXPECT_DOUBLE_EQ(lrFactor(o, 9, 10), 1.0);
  EXPECT_DOUBLE_EQ(lrFactor(withSchedule("constant", 0), 0, 10), 1.0);
}

TEST(LrSchedule, CosineAndLinearDecayToMinLr) {
  // T = 10, W = 2, r = 0.05 / 0.5 = 0.1.
  TrainOptions cos = withSchedule("cosine", 2, 0.05), lin = withSchedule("linear", 2, 0.05);
  EXPECT_DOUBLE_EQ(lrFactor(cos, 1, 10), 0.5); // warm-up 1/2
  EXPECT_DOUBLE_EQ(lrFactor(cos, 2, 10), 1.0); // p = 0: 0.1 + 0.9 * (1 + 1) / 2
  // k = 6: p = 4/8, cos(pi/2) = 0: 0.1 + 0.9 * 0.5 = 0.55; linear (10-6)/8 = 0.5: the same.
  EXPECT_NEAR(lrFactor(cos, 6, 10), 0.55, 1e-15);
  EXPECT_NEAR(lrFactor(lin, 6, 10), 0.55, 1e-15);
  // k = 9 (the last step): linear 0.1 + 0.9 * 1/8 = 0.2125; cosine 0.1 + 0.9 * (1 + cos(7pi/8)) / 2.
  EXPECT_NEAR(lrFactor(lin, 9, 10), 0.2125, 1e-15);
  EXPECT_NEAR(lrFactor(cos, 9, 10), 0.1 + 0.45 * (1 + std::cos(M_PI * 7 / 8)), 1e-15);
  // Without --min-lr the decay ends at 0: linear k = 9 is 1/8.
  EXPECT_NEAR(lrFactor(withSchedule("linear", 2), 9, 10), 0.125, 1e-15);
  // A warm-up as long as the run: the span max(1, T - W) never divides by 0.
  EXPECT_DOUBLE_EQ(lrFactor(withSchedule("cosine", 10), 9, 10), 0.9);
}

TEST(Clipping, FactorAndNorm) {
  EXPECT_DOUBLE_EQ(clipFactor(10.0, 1.0), 1.0 / (10.0 + 1e-6));
  EXPECT_DOUBLE_EQ(clipFactor(0.5, 1.0), 1.0); // never scales up
  torch::Tensor a = torch::zeros({2}, torch::requires_grad()), b = torch::zeros({1}, torch::requires_grad()),
                c = torch::zeros({3}, torch::requires_grad()); // c has no gradient
  a.mutable_grad() = torch::tensor({3.0f, 4.0f});
  b.mutable_grad() = torch::tensor({12.0f});
  EXPECT_NEAR(runtime::gradSquaredNorm({a, b, c}), 169.0, 1e-9); // 9 + 16 + 144
  scaleGradients({a, b, c}, 0.5);
  EXPECT_FLOAT_EQ(a.grad()[1].item<float>(), 2.0f);
  EXPECT_FLOAT_EQ(b.grad()[0].item<float>(), 6.0f);
  EXPECT_FALSE(c.grad().defined());
}

TEST(Optimizers, SgdNesterovWithWeightDecayStepsAsPyTorch) {
  TrainOptions o;
  o.lr = 0.1;
  o.momentum = 0.9;
  o.nesterov = true;
  o.weight_decay = 0.1;
  torch::Tensor p = torch::ones({1}, torch::requires_grad());
  auto opt = makeOptimizer(o, {p});
  p.mutable_grad() = torch::tensor({2.0f});
  opt->step();
  // d = 2 + 0.1 * 1 = 2.1; buffer = 2.1; nesterov d = 2.1 + 0.9 * 2.1 = 3.99; p = 1 - 0.1 * 3.99.
  EXPECT_NEAR(p.item<float>(), 0.601, 1e-6);
}

TEST(Optimizers, PyTorchDefaultsAndTheScheduledLr) {
  TrainOptions o;
  o.optimizer = OptimizerKind::AdamW;
  torch::Tensor p = torch::ones({1}, torch::requires_grad());
  auto adamw = makeOptimizer(o, {p});
  auto &opts = static_cast<torch::optim::AdamWOptions &>(adamw->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(opts.weight_decay(), 0.01); // AdamW's own default, unlike Adam's 0
  EXPECT_DOUBLE_EQ(std::get<1>(opts.betas()), 0.999);
  o.optimizer = OptimizerKind::Adam;
  o.betas = std::make_pair(0.8, 0.95);
  o.eps = 1e-6;
  auto adam = makeOptimizer(o, {p});
  auto &aopts = static_cast<torch::optim::AdamOptions &>(adam->param_groups()[0].options());
  EXPECT_DOUBLE_EQ(aopts.weight_decay(), 0.0);
  EXPECT_DOUBLE_EQ(std::get<0>(aopts.betas()), 0.8);
  EXPECT_DOUBLE_EQ(aopts.eps(), 1e-6);
  setLearningRate(*adam, 0.25);
  EXPECT_DOUBLE_EQ(adam->param_groups()[0].options().get_lr(), 0.25);
}

TEST(Options, FlagsThatDoNotApplyAreErrors) {
  auto message = [](const TrainOptions &o) { return checkOptimizationOptions(o).message(); };
  TrainOptions o;
  EXPECT_TRUE(checkOptimizationOptions(o).ok());
  o.nesterov = true;
  EXPECT_EQ(message(o), "--nesterov needs a --momentum above 0 and zero --dampening");
  o.momentum = 0.9;
  EXPECT_TRUE(checkOptimizationOptions(o).ok());
  o.betas = std::make_pair(0.9, 0.99);
  EXPECT_EQ(message(o), "--betas does not apply to --optimizer sgd (adam and adamw only)");
  o = TrainOptions();
  o.optimizer = OptimizerKind::AdamW;
  o.momentum = 0.9;
  EXPECT_EQ(message(o), "--momentum does not apply to --optimizer adamw (sgd only; Adam's are --betas)");
  o = TrainOptions();
  o.min_lr = 0.001;
  EXPECT_EQ(message(o), "--min-lr applies to the cosine and linear schedules, not --lr-schedule constant");
  o.lr_schedule = "cosine";
  o.min_lr = 0.5; // above --lr 0.01
  EXPECT_EQ(message(o), "--min-lr 0.5: must be in [0, --lr 0.01]");
  o = TrainOptions();
  o.synthetic = true;
  o.epochs = 2;
  EXPECT_EQ(message(o), "--epochs needs --data (synthetic data has no sample count); pass --steps instead");
}

// A checkpoint carries LossScaler::State; restored into a fresh scaler it
// must go on exactly as the original: same scale, and growth after the same
// number of further good steps (the growth tracker, not only the scale).
TEST(LossScaling, RestoredStateContinuesLikeTheOriginal) {
  LossScaler::Options o;
  o.init_scale = 1024;
  o.growth_interval = 3;
  LossScaler original(o);
  original.update(true);  // overflow: 1024 * 0.5 = 512
  original.update(false); // 1 good step of 3
  original.update(false); // 2 of 3
  EXPECT_EQ(original.scale(), 512);

  LossScaler resumed; // the defaults (2^16, interval 2000) until restored
  resumed.restore(original.state());
  EXPECT_EQ(resumed.scale(), 512);
  original.update(false); // the 3rd good step: 512 * 2 = 1024
  resumed.update(false);
  EXPECT_EQ(original.scale(), 1024);
  EXPECT_EQ(resumed.scale(), 1024);
  original.update(true);
  resumed.update(true);
  EXPECT_EQ(resumed.scale(), original.scale());
  EXPECT_EQ(resumed.state().growth_tracker, 0);
}

TEST(Epochs, StepsCoverEverySampleAtLeastEpochsTimes) {
  EXPECT_EQ(stepsForEpochs(3, 64, 16), 12); // 192 / 16
  EXPECT_EQ(stepsForEpochs(1, 10, 4), 3);   // ceil(2.5)
  EXPECT_EQ(stepsForEpochs(2, 10, 4), 5);   // ceil(20 / 4), not 2 * ceil(10 / 4) = 6
}

} // namespace
} // namespace rannc::train
