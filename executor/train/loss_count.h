// Losses whose mean is over a count the data decides (cross-entropy with
// ignore_index, a masked sum over a count of its mask): each micro-batch's
// share of the step's loss gradient (Note [loss denominators]).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "executor/runtime/interpreter.h"
#include "executor/schedule/schedule.h"
#include "planner/ir/ir.h"

namespace rannc::train {

// Note [loss denominators]
// A loss that is a mean over samples splits exactly: micro-batch i of b
// samples weighs b/B. A loss that is a mean over a count the data decides
// does not: BERT's masked-LM loss is the mean over the tokens whose label is
// not -100, a causal LM's over the tokens that are not padding, and the
// micro-batches hold different numbers of them. One device computes
// sum(losses) / count over the whole batch; the micro-batches' means weighted
// by samples are something else (3e-3 off on a BERT). So rannc finds, in the
// graph, the denominator of the loss when it depends on the data alone:
//  - a fused loss with reduction mean whose count is the data's: ONNX
//    SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss with ignore_index,
//    ATen cross_entropy_loss / nll_loss(_nd, 2d, _forward) (which always
//    carry an ignore_index): the count of targets not ignored;
//  - a division N / D (ONNX Div, aten::div) whose divisor D is computed from
//    data inputs and constants alone (no parameter, no buffer): what
//    exporters write when they decompose such a loss (a masked sum over the
//    sum of the mask), and HF's sum / num_items_in_batch;
// reached from the loss through ops that only reshape or cast it. At the
// start of a step the loss stage evaluates D (those nodes alone, on the data,
// as in forward) for every micro-batch and every replica's samples, and each
// micro-batch's backward starts from D_i / sum(D) instead of b/B: the sum of
// the gradients is the gradient of sum(N) / sum(D), the whole batch's loss
// (Hugging Face calls sum(D) num_items_in_batch). With accumulation each
// global batch has its own sum and weighs 1/K, as `(loss / K).backward()`
// per batch does. A shape-only denominator (a plain mean) gives b/B again.
// A micro-batch in which no target counts gives 0/0 in PyTorch too: its
// logged share is left out.

/// The denominator of the loss, when the data decides it (Note [loss denominators]).
struct LossDenominator {
  enum class Kind { Value, Targets };
  Kind kind = Kind::Value;
  ir::ValueId value = ir::kNoValue; ///< D itself (Value) or the targets whose non-ignored count it is
  int64_t ignore_index = 0;         ///< Targets: the label that does not count
  std::vector<ir::NodeId> nodes;    ///< the nodes computing `value` from data and constants, in graph order
  std::string what;                 ///< for people: "the targets not equal to -100 of 'loss'"
};

/// The loss's data-decided denominator, or nullopt (a mean over samples). Torch-free.
std::optional<LossDenominator> findLossDenominator(const ir::Graph &g);

/// Data inputs for samples [first, first + count) of the step's stream, as forward gets them.
using FeedSamples = std::function<runtime::ValueMap(int64_t first, int64_t count)>;

/// Each micro-batch's share of its global batch's loss on this replica of the
/// loss stage: samples / B, or D_i / sum(D) for a data-decided denominator.
/// The share is a fraction {numerator, denominator} so that a mean over
/// samples computes exactly what it always did.
class LossShares {
public:
  /// `shards`: the sample ranges of the loss stage's replicas within a
  /// micro-batch of `b` samples; M micro-batches per global batch.
  LossShares(const ir::Graph &g, std::vector<schedule::SampleRange> shards, int replica, int64_t b, int M);

  /// The denominator found, if any.
  const std::optional<LossDenominator> &denominator() const { return den_; }
  /// Computes the shares of `microbatches` micro-batches (K*M) whose samples
  /// start at `first` in the stream (a no-op for a mean over samples).
  void newStep(int64_t first, int microbatches, const FeedSamples &feed);
  /// Micro-batch `mb`'s share of its global batch's loss, as {part, whole}.
  std::pair<double, double> share(int mb) const;

private:
  double count(const runtime::ValueMap &feeds) const;

  const ir::Graph &g_;
  std::vector<schedule::SampleRange> shards_;
  int replica_;
  int64_t b_;
  int M_;
  std::optional<LossDenominator> den_;
  std::vector<std::pair<double, double>> shares_; ///< per micro-batch of the step (data-decided only)
};

} // namespace rannc::train
