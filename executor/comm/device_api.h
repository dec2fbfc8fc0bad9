// The CUDA runtime and NCCL calls a device communicator makes, as an
// interface: nccl_comm.cpp implements it with the real libraries, and the
// rehearsal (rehearsal.h) with queues over MPI on the CPU. No CUDA or NCCL
// header here: streams and events are opaque pointers.
//
// Note [NCCL-facing interface]
// The device communicator's logic (device_comm.cpp: which stream waits for
// which, when a sent payload may go, how a group is bracketed, how a
// reduce-scatter's result reaches the front of its buffer) is what can be
// wrong without a GPU to show it. So it is written once, against the calls
// below, each the thin image of one CUDA or NCCL function, and the stand-in
// sits under them: a rehearsal runs every line of that logic, and of the
// trainer above it, as a GPU run would. What the stand-in cannot show is the
// libraries themselves (docs/gpu.md, "What has run").
#pragma once

#include <cstddef>
#include <memory>

#include "executor/comm/comm.h"

namespace rannc::comm {

/// One NCCL communicator (ncclComm_t): its operations are queued on
/// `stream` and run in the order each rank issued them.
class NcclComm {
public:
  virtual ~NcclComm() = default; ///< ncclCommDestroy
  /// ncclSend of `bytes` bytes to `peer`.
  virtual void send(const void *data, size_t bytes, int peer, void *stream) = 0;
  /// ncclRecv of exactly `bytes` bytes from `peer`.
  virtual void recv(void *data, size_t bytes, int peer, void *stream) = 0;
  /// ncclAllReduce of `count` floats, in place.
  virtual void allReduce(float *data, size_t count, ReduceOp op, void *stream) = 0;
  /// ncclReduceScatter: `out` gets the sum of block rank() of every rank's
  /// `in` (`block` floats each).
  virtual void reduceScatter(const float *in, float *out, size_t block, void *stream) = 0;
  /// ncclAllGather: every rank's `block` floats of `in`, in rank order, into `out`.
  virtual void allGather(const float *in, float *out, size_t block, void *stream) = 0;
};

/// The CUDA runtime (streams, events, copies) and NCCL's process-wide calls
/// of one device. The null stream is the compute stream LibTorch's default
/// (the legacy default stream on CUDA; the host itself in the rehearsal).
class DeviceApi {
public:
  virtual ~DeviceApi() = default;
  /// cudaStreamCreateWithFlags(non-blocking).
  virtual void *createStream() = 0;
  virtual void destroyStream(void *stream) = 0;
  /// cudaEventCreate (no timing) and cudaEventRecord on `stream`.
  virtual void *recordEvent(void *stream) = 0;
  virtual void destroyEvent(void *event) = 0;
  /// cudaEventQuery: whether the work queued before the event is done.
  virtual bool eventDone(void *event) = 0;
  /// cudaStreamWaitEvent: `stream`'s later work waits for `event`.
  virtual void streamWaitEvent(void *stream, void *event) = 0;
  /// cudaStreamSynchronize: the host waits for `stream`'s queued work.
  virtual void synchronize(void *stream) = 0;
  /// cudaMemcpyAsync (direction from the pointers) queued on `stream`.
  virtual void copy(void *dst, const void *src, size_t bytes, void *stream) = 0;
  /// ncclGroupStart / ncclGroupEnd: the operations between are issued together.
  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;
  /// ncclCommInitRank over the ranks of `host` (collective over them).
  virtual std::unique_ptr<NcclComm> initComm(Communicator &host) = 0;
  /// Whether the device's memory is the host's (the rehearsal: its tensors
  /// are CPU tensors, which its communicators take as device memory).
  virtual bool deviceMemoryIsHost() const { return false; }
};

} // namespace rannc::comm
