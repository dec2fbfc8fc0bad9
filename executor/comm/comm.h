// The narrow communicator interface the runtime talks to (after c10d): point
// to point messages, all-reduce, barrier and abort. Implementations are the
// only files that include mpi.h / nccl.h. Payloads are raw bytes, so this
// library stays free of LibTorch.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace rannc::comm {

enum class ReduceOp { Sum, Max };

/// Bytes to send, and what keeps them alive until the send completes (a
/// string, a tensor: the communicator only holds the pointer).
struct Payload {
  const void *data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
};

/// A collective started by Communicator::startAllReduce, finished by wait().
class Request {
public:
  virtual ~Request() = default;
  /// Lets the collective progress (MPI moves data only inside MPI calls);
  /// true once it is complete.
  virtual bool test() = 0;
  /// Blocks until it is complete; the buffer then holds the result.
  virtual void wait() = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Starts sending `payload` to `dst`; returns at once. Messages between one
  /// pair of ranks with one tag arrive in the order they were sent. The
  /// payload's owner is dropped as soon as the send is seen complete (at a
  /// later send, receive or waitSends), not kept to the end of the step.
  virtual void sendBytes(Payload payload, int dst, int tag) = 0;
  /// sendBytes of a string, which the communicator keeps until it is sent.
  void send(std::shared_ptr<const std::string> payload, int dst, int tag) {
    const void *data = payload->data();
    const size_t size = payload->size();
    sendBytes(Payload{data, size, std::move(payload)}, dst, tag);
  }
  /// Receives the next message from `src` with `tag`, whatever its size.
  virtual std::string recv(int src, int tag) = 0;
  /// Receives the next message from `src` with `tag` into `data`, which must
  /// be exactly its size (`size` bytes): no staging copy.
  virtual void recvInto(void *data, size_t size, int src, int tag) = 0;
  /// Waits until every send started so far has completed.
  virtual void waitSends() = 0;
  /// In-place all-reduce over all ranks.
  virtual void allReduce(double *data, int count, ReduceOp op) = 0;
  virtual void allReduce(float *data, int64_t count, ReduceOp op) = 0;
  /// Starts an in-place all-reduce and returns at once; `data` must stay
  /// untouched until the request is complete. Ranks start theirs in the same order.
  virtual std::unique_ptr<Request> startAllReduce(float *data, int64_t count, ReduceOp op) = 0;
  /// Starts an in-place reduce-scatter of `data`, size() blocks of `block`
  /// floats: when complete, data[0, block) holds the sum over all ranks of
  /// block rank() (the rest of `data` is undefined). `block` < 2^31.
  virtual std::unique_ptr<Request> startReduceScatter(float *data, int64_t block) = 0;
  /// Starts an in-place all-gather: each rank's block of `block` floats lies
  /// at data[rank() * block]; when complete every rank holds all blocks.
  virtual std::unique_ptr<Request> startAllGather(float *data, int64_t block) = 0;
  virtual void barrier() = 0;
  /// Copies `bytes` bytes at `data` on rank `root` to `data` on every rank.
  virtual void broadcast(void *data, size_t bytes, int root) = 0;
  /// The ranks with the same `color` as a new communicator, ordered by `key`
  /// (collective over this communicator).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  /// Stops every rank of the job at once (used after an error on one rank).
  [[noreturn]] virtual void abort(int code) = 0;
};

/// The MPI library's own description (MPI_Get_library_version, first line);
/// needs no MPI_Init.
std::string mpiLibraryVersion();

/// Initializes MPI (once per process) and wraps MPI_COMM_WORLD. MPI is
/// finalized when the communicator is destroyed.
std::unique_ptr<Communicator> createMpiCommunicator(int *argc, char ***argv);

} // namespace rannc::comm
