#include "executor/train/options.h"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "executor/train/trainer.h"
#include "planner/plan/plan.h"
#include "planner/support/words.h"

namespace rannc::train {

namespace {
const char *const kOptimizerWords[] = {"sgd", "adam", "adamw"}; // in OptimizerKind's order
const char *const kShuffleWords[] = {"off", "on"};               // in Shuffle's order
} // namespace

Expected<OptimizerKind> parseOptimizer(std::string_view text) {
  if (auto k = enumFromWord<OptimizerKind>(text, kOptimizerWords)) return *k;
  return Error{"--optimizer " + std::string(text) + ": unknown (sgd, adam or adamw)"};
}

std::string optimizerName(OptimizerKind k) { return kOptimizerWords[size_t(k)]; }

Expected<Shuffle> parseShuffle(std::string_view text) {
  if (auto s = enumFromWord<Shuffle>(text, kShuffleWords)) return *s;
  return Error{"--shuffle must be on or off (got '" + std::string(text) + "')"};
}

std::string shuffleName(Shuffle s) { return kShuffleWords[size_t(s)]; }

Expected<std::pair<double, double>> parseBetas(std::string_view text) {
  const std::string betas(text);
  const size_t comma = betas.find(',');
  try {
    size_t used1 = 0, used2 = 0;
    if (comma == std::string::npos) throw std::invalid_argument("no comma");
    double b1 = std::stod(betas.substr(0, comma), &used1), b2 = std::stod(betas.substr(comma + 1), &used2);
    if (used1 != comma || used2 != betas.size() - comma - 1) throw std::invalid_argument("trailing text");
    return std::make_pair(b1, b2);
  } catch (const std::exception &) {
    return Error{"'" + betas + "' is not two numbers B1,B2 (e.g. 0.9,0.999)"};
  }
}

Expected<comm::RehearsalOptions> parseRehearsal(std::string_view text) {
  comm::RehearsalOptions r;
  std::string rest(text);
  while (!rest.empty()) {
    const size_t comma = rest.find(',');
    const std::string part = rest.substr(0, comma);
    rest = comma == std::string::npos ? "" : rest.substr(comma + 1);
    int used = 0;
    if (std::sscanf(part.c_str(), "stall=%lf%n", &r.stall_s, &used) == 1 && size_t(used) == part.size() &&
        r.stall_s > 0)
      continue;
    if (std::sscanf(part.c_str(), "swap=%d:%d%n", &r.swap_rank, &r.swap_call, &used) == 2 &&
        size_t(used) == part.size() && r.swap_call > 0)
      continue;
    return Error{"'" + part + "' is neither stall=SECONDS nor swap=RANK:CALL"};
  }
  return r;
}

OptimizerKind planOptimizer(const std::string &plan_path) {
  auto plan = plan::readPlan(plan_path);
  if (!plan) return OptimizerKind::Sgd;
  const std::string &word = plan->estimates().optimizer();
  auto k = parseOptimizer(word == "momentum" ? "sgd" : word);
  return k ? *k : OptimizerKind::Sgd;
}

int64_t bucketBytes(double mib) { return std::max<int64_t>(1, int64_t(mib * double(1 << 20))); }

Status finishTrainOptions(const ExecFlags &flags, TrainOptions &opts) {
  opts.bucket_bytes = bucketBytes(flags.bucket_mib);
  if (flags.gpu_transport != "nccl" && flags.gpu_transport != "host" && flags.gpu_transport != "rehearsal")
    return Error{"--gpu-transport must be nccl, host or rehearsal (got '" + flags.gpu_transport + "')"};
  opts.host_staged = flags.gpu_transport == "host";
  opts.rehearsal.reset();
  if (flags.gpu_transport == "rehearsal") {
    auto rehearsal = parseRehearsal(flags.rehearsal);
    if (!rehearsal) return Error{"RANNC_REHEARSAL: " + rehearsal.error().message};
    opts.rehearsal = *rehearsal;
  }
  if (flags.optimizer.empty()) {
    opts.optimizer = planOptimizer(opts.plan);
  } else {
    auto optimizer = parseOptimizer(flags.optimizer);
    if (!optimizer) return optimizer.error();
    opts.optimizer = *optimizer;
  }
  auto shuffle = parseShuffle(flags.shuffle);
  if (!shuffle) return shuffle.error();
  opts.shuffle = *shuffle;
  opts.device.reset();
  if (!flags.device.empty()) {
    auto device = cluster::parseDeviceKind(flags.device);
    if (!device) return Error{"--device " + device.error().message};
    opts.device = *device;
  }
  if (flags.betas) {
    auto betas = parseBetas(*flags.betas);
    if (!betas) return Error{"--betas: " + betas.error().message};
    opts.betas = *betas;
  }
  return {};
}

} // namespace rannc::train
