// Communication of device (CUDA) memory: NCCL where the CUDA toolkit was found
// at build time. Bootstrapped over the host communicator (the NCCL unique id
// travels over MPI). Only nccl_comm.cpp includes nccl.h and the CUDA runtime,
// so this header stays free of both: streams are passed as void*
// (cudaStream_t).
//
// Note [device streams]
// LibTorch computes on its current stream (`compute` below). Each
// DeviceCommunicator issues its operations on a stream of its own, so they
// overlap computation, and the two are ordered by CUDA events only where data
// passes between them: before an operation reads or writes a tensor, the
// communicator's stream waits for what `compute` had queued when the
// operation was issued (waitFor); before computation reads a result, the
// compute stream waits for the operation (makeWait, Request::wait). A buffer
// the communicator reads or writes must stay alive until the operation is
// done: its owner keeps a reference until then (mark()/done()). The caching
// allocator then never hands the memory to another tensor while the
// communicator's stream still uses it, because every free happens after the
// compute stream waited for that use.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "executor/comm/comm.h"

namespace rannc::comm {

/// Operations a DeviceCommunicator had issued when it was taken.
class DeviceMark {
public:
  virtual ~DeviceMark() = default;
  /// True once they have all finished (never blocks).
  virtual bool done() = 0;
};

/// Point-to-point and collectives on device buffers, in stream order (Note
/// [device streams]).
class DeviceCommunicator {
public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sends `bytes` bytes of device memory at `buf` to `dst` (the receiver
  /// must post a recv of the same size). Sends and receives that depend on
  /// each other (a rank sending to itself, two ranks exchanging) must be
  /// issued between groupStart() and groupEnd(), or NCCL blocks on the first.
  virtual void send(const void *buf, size_t bytes, int dst) = 0;
  virtual void recv(void *buf, size_t bytes, int src) = 0;
  /// Brackets sends and receives that NCCL must issue together (ncclGroupStart/End).
  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;
  /// In-place collectives on `count` floats of device memory over all ranks.
  virtual void allReduce(float *buf, int64_t count, ReduceOp op) = 0;
  void allReduceSum(float *buf, int64_t count) { allReduce(buf, count, ReduceOp::Sum); }
  /// In place: buf holds size() blocks of `block` floats; afterwards block
  /// rank() holds the sum over the ranks of that block.
  virtual void reduceScatterSum(float *buf, int64_t block) = 0;
  /// In place: block rank() of buf goes to every rank.
  virtual void allGather(float *buf, int64_t block) = 0;
  /// Later operations here wait for the work `stream` has queued so far.
  virtual void waitFor(void *stream) = 0;
  /// `stream`'s later work waits for the operations issued here so far.
  virtual void makeWait(void *stream) = 0;
  /// Marks the operations issued so far.
  virtual std::unique_ptr<DeviceMark> mark() = 0;
  /// Waits until every operation issued so far has finished.
  virtual void synchronize() = 0;
};

/// True when this build has the NCCL implementation.
bool ncclCompiled();
/// The NCCL library's version ("2.30.7"), or "not compiled".
std::string ncclVersion();
/// Number of CUDA devices visible to this process (0 without CUDA or GPUs).
int visibleCudaDevices();
/// An NCCL communicator over the same ranks as `host`, on CUDA device
/// `device` (collective over `host`). Throws std::runtime_error when NCCL or
/// the device is missing.
std::unique_ptr<DeviceCommunicator> createNcclCommunicator(Communicator &host, int device);

/// A communicator over the ranks of `host` whose float collectives
/// (allReduce, startAllReduce, startReduceScatter, startAllGather) take CUDA
/// device memory written on `stream`: over `nccl` when given (it spans the
/// same ranks), otherwise staged through host memory and `host` (ranks that
/// share a GPU, which NCCL refuses). A request's wait() orders `stream` after
/// the collective (Note [device streams]); staged, it has finished by then.
/// Everything else (messages, double all-reduce, split) is `host`'s.
std::unique_ptr<Communicator> deviceCollectives(std::unique_ptr<Communicator> host,
                                                std::unique_ptr<DeviceCommunicator> nccl, void *stream);

} // namespace rannc::comm
