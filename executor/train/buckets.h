// Gradient all-reduce in buckets that overlaps backward (after PyTorch DDP's
// reducer): a stage's replicas sum their gradients while the last backward
// of the step is still running.
//
// Note [gradient buckets]
// Parameters are grouped, in reverse model order (the order backward makes
// their gradients final), into buckets of at most `bucket_bytes`. Before the
// step's last backward the trainer arms the buckets; a post-hook on each
// parameter's gradient accumulator counts the parameter in, and when a
// bucket's last parameter arrives its gradients are copied into the bucket's
// flat buffer and a non-blocking all-reduce starts. Buckets start strictly in
// index order (a ready bucket waits for its predecessors), so every replica
// issues the same collectives in the same order whatever order autograd
// finishes them in. Each hook also lets MPI progress the buckets in flight
// (MPI moves data only inside MPI calls). finish() starts whatever did not
// start (a parameter no gradient reached) and waits for all. The gradients
// are views into their bucket's buffer (as DDP's gradient_as_bucket_view):
// autograd accumulates into them in place and zero_grad zeroes them in place,
// so the all-reduce needs no copies and no memory beyond the gradients the
// planner already counts. Earlier backwards of the step (other micro-batches)
// only accumulate: their hooks do nothing while the buckets are not armed.
//
// Sharded (ZeRO-1, Note [sharded optimizer state] in zero.h), each bucket is
// padded to a multiple of the replicas and its parameters move into a flat
// buffer as well; replica j owns block j of every bucket. The buckets then
// reduce-scatter instead, so each replica ends with the sums of its own
// blocks only, which finish() moves to where the block lies in the bucket.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "executor/comm/comm.h"

namespace rannc::train {

class GradientBuckets {
public:
  /// How the buckets reduce and whether the parameters are sharded.
  enum class Mode {
    AllReduce,     ///< every replica gets every sum
    ShardedUpdate, ///< all-reduce, parameters flat and sharded (a stage whose tied parameters need whole sums)
    ReduceScatter, ///< each replica gets the sums of its own blocks, parameters flat and sharded
  };
  /// This rank's block of one bucket: views into the flat parameter and gradient buffers.
  struct Shard {
    torch::Tensor param, grad;
  };

  /// `params`: the stage's parameters (float32 leaves), in model order.
  GradientBuckets(comm::Communicator &group, const std::vector<torch::Tensor> &params, int64_t bucket_bytes,
                  Mode mode = Mode::AllReduce);
  ~GradientBuckets();
  GradientBuckets(const GradientBuckets &) = delete;
  GradientBuckets &operator=(const GradientBuckets &) = delete;

  /// Call before the step's last backward: its gradients are final.
  void arm();
  /// Starts the buckets not started yet and waits for every one: the
  /// gradients then hold the sums (ReduceScatter: only this rank's blocks
  /// do); disarms.
  void finish();
  Mode mode() const { return mode_; }
  bool sharded() const { return mode_ != Mode::AllReduce; }
  /// Sharded: this rank's block of each bucket.
  std::vector<Shard> shards() const;
  /// Sharded: the parameters of bucket i in their order in its flat buffer.
  const std::vector<torch::Tensor> &bucketParams(size_t i) const { return buckets_[i].params; }
  /// Sharded: every rank's updated block of every bucket to every rank.
  void gatherParameters();
  comm::Communicator &group() const { return group_; }
  /// Number of buckets (for logs and tests).
  size_t size() const { return buckets_.size(); }
  /// Buckets started by hooks during the last armed backward (not by finish()).
  int startedEarly() const { return started_early_; }

private:
  struct Bucket {
    std::vector<torch::Tensor> params; ///< their .grad are views of `flat`
    int pending = 0; ///< parameters whose final gradient has not arrived
    torch::Tensor flat;       ///< the gradients (padded to a multiple of the replicas when sharded)
    torch::Tensor param_flat; ///< sharded: the parameters, same layout
    int64_t block = 0;        ///< sharded: flat.numel() / replicas
    std::unique_ptr<comm::Request> request;
  };
  void arrived(size_t bucket);
  /// Makes each parameter's gradient a view of `b`'s buffer (copying a
  /// gradient that was replaced); true if any had to be moved.
  bool adopt(Bucket &b);
  void start(Bucket &b);
  void startReady();

  comm::Communicator &group_;
  Mode mode_;
  std::vector<Bucket> buckets_;
  /// Each parameter's gradient accumulator (kept alive: it holds the hook) and the hook's key.
  std::vector<std::pair<c10::intrusive_ptr<torch::autograd::Node>, uintptr_t>> hooks_;
  bool armed_ = false;
  size_t next_ = 0; ///< the first bucket not started
  int started_early_ = 0;
};

} // namespace rannc::train
