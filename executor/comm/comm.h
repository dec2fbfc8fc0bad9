// The one communicator interface the runtime talks to (after c10d): point to
// point messages, collectives, barrier and abort. Every buffer says whether
// it is host or device memory (Memory); an implementation that cannot reach
// a kind refuses it instead of misreading the pointer. Implementations are
// the only files that include mpi.h / nccl.h. Payloads are raw bytes, so
// this library stays free of LibTorch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace rannc::comm {

enum class ReduceOp { Sum, Max };

/// Where a buffer lives: host memory, or the memory of the CUDA device the
/// communicator drives (createDeviceCommunicator in device_comm.h).
enum class Memory { Host, Device };

/// The element types of collectives.
enum class DType { Float32, Float64 };

/// `count` elements of `dtype` at `data` in `memory`: what a collective
/// reads and overwrites in place.
struct Buffer {
  void *data = nullptr;
  int64_t count = 0;
  DType dtype = DType::Float32;
  Memory memory = Memory::Host;

  static Buffer host(float *data, int64_t count) { return {data, count, DType::Float32, Memory::Host}; }
  static Buffer host(double *data, int64_t count) { return {data, count, DType::Float64, Memory::Host}; }
  static Buffer device(float *data, int64_t count) { return {data, count, DType::Float32, Memory::Device}; }
  /// Bytes per element.
  size_t elementSize() const { return dtype == DType::Float64 ? 8 : 4; }
};

/// Bytes to send, where they live, and what keeps them alive until the send
/// completes (a string, a tensor: the communicator only holds the pointer).
struct Payload {
  const void *data = nullptr;
  size_t size = 0;
  std::shared_ptr<const void> owner;
  Memory memory = Memory::Host;
};

/// An operation started by a Communicator, finished by wait().
class Request {
public:
  virtual ~Request() = default;
  /// Lets the operation progress (MPI moves data only inside MPI calls);
  /// true once it is complete.
  virtual bool test() = 0;
  /// Until it is complete: host memory holds the result when this returns;
  /// device memory holds it for the compute stream's later work (Note
  /// [device streams] in device_comm.h).
  virtual void wait() = 0;
};

class Communicator {
public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Messages. Messages between one pair of ranks with one tag arrive in the
  // order they were sent (device ones: in the order of the device messages
  // between the pair, which have no tags).

  /// Starts sending `payload` to `dst`; returns at once. The payload's owner
  /// is dropped as soon as the send is seen complete (at a later message
  /// call or waitSends), not kept to the end of the step.
  virtual void sendBytes(Payload payload, int dst, int tag) = 0;
  /// sendBytes of a string, which the communicator keeps until it is sent.
  void send(std::shared_ptr<const std::string> payload, int dst, int tag) {
    const void *data = payload->data();
    const size_t size = payload->size();
    sendBytes(Payload{data, size, std::move(payload)}, dst, tag);
  }
  /// Receives the next host message from `src` with `tag`, whatever its size.
  virtual std::string recv(int src, int tag) = 0;
  /// Receives the next message from `src` with `tag` into `data`, which must
  /// be exactly its size (`size` bytes) and lie in `memory`: no staging copy.
  virtual void recvInto(void *data, size_t size, Memory memory, int src, int tag) = 0;
  /// Brackets messages that must be issued together (a rank sending to
  /// itself, two ranks exchanging): device messages complete only at
  /// groupEnd(), so they cannot block one another. Host messages need none.
  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;
  /// Waits until every send started so far has completed.
  virtual void waitSends() = 0;
  /// Waits until every host send started so far with `tag` has completed,
  /// and every device send (which carries no tag).
  virtual void waitSendsTagged(int tag) = 0;

  // Collectives over all ranks, in place; ranks issue them in the same order.

  /// All-reduce of `buf`.
  virtual void allReduce(Buffer buf, ReduceOp op) = 0;
  /// All-reduce of `count` host doubles (start-up agreement, step figures).
  void allReduce(double *data, int count, ReduceOp op) { allReduce(Buffer::host(data, count), op); }
  /// Starts an all-reduce of `buf` and returns at once; `buf` must stay
  /// untouched until the request is complete.
  virtual std::unique_ptr<Request> startAllReduce(Buffer buf, ReduceOp op) = 0;
  /// Starts a reduce-scatter of `buf`, size() blocks of floats (each < 2^31):
  /// when complete, the first block holds the sum over all ranks of block
  /// rank() (the rest of `buf` is undefined).
  virtual std::unique_ptr<Request> startReduceScatter(Buffer buf) = 0;
  /// Starts an all-gather of `buf`, size() blocks of floats: each rank's
  /// block rank() is its own; when complete every rank holds all blocks.
  virtual std::unique_ptr<Request> startAllGather(Buffer buf) = 0;
  virtual void barrier() = 0;
  /// Copies `bytes` bytes of host memory at `data` on rank `root` to `data` on every rank.
  virtual void broadcast(void *data, size_t bytes, int root) = 0;
  /// The ranks with the same `color` as a new host communicator, ordered by
  /// `key` (collective over this communicator).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
  /// Stops every rank of the job at once (used after an error on one rank).
  [[noreturn]] virtual void abort(int code) = 0;
};

/// The MPI library's own description (MPI_Get_library_version, first line);
/// needs no MPI_Init.
std::string mpiLibraryVersion();

/// Initializes MPI (once per process) and wraps MPI_COMM_WORLD: host memory
/// only. MPI is finalized when the communicator is destroyed.
std::unique_ptr<Communicator> createMpiCommunicator(int *argc, char ***argv);

} // namespace rannc::comm
