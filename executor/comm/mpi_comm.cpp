#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/comm/comm.h"
#include "executor/comm/mpi_handle.h"

namespace rannc::comm {
namespace {

void check(int rc, const char *what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw std::runtime_error(std::string(what) + " failed: " + std::string(msg, len));
  }
}

/// Point-to-point counts are ints: one message is below 2 GiB.
void checkMessageSize(size_t bytes) {
  if (bytes > static_cast<size_t>(INT32_MAX))
    throw std::runtime_error("message of " + std::to_string(bytes) + " bytes exceeds MPI's 2 GiB limit");
}

MPI_Op toMpi(ReduceOp op) { return op == ReduceOp::Sum ? MPI_SUM : MPI_MAX; }
MPI_Datatype toMpi(DType t) { return t == DType::Float64 ? MPI_DOUBLE : MPI_FLOAT; }

/// MPI reaches host memory only: a device buffer here is a caller's mistake,
/// refused before the pointer is read.
void requireHost(Memory memory, const char *what) {
  if (memory != Memory::Host)
    throw std::logic_error(std::string("MPI communicator: ") + what +
                           " of device memory (a communicator of createDeviceCommunicator takes it)");
}

/// The element `i` of `buf`.
void *at(const Buffer &buf, int64_t i) { return static_cast<char *>(buf.data) + i * int64_t(buf.elementSize()); }

// MPI counts are ints: reduce in chunks below 2^31 elements.
constexpr int64_t kChunk = int64_t{1} << 30;

class MpiRequest final : public Request {
public:
  std::vector<MPI_Request> requests;
  bool test() override {
    int done = 0;
    check(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &done, MPI_STATUSES_IGNORE),
          "MPI_Testall");
    return done != 0;
  }
  void wait() override {
    check(MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE), "MPI_Waitall");
  }
};

class MpiCommunicator final : public Communicator {
public:
  MpiCommunicator(int *argc, char ***argv) : comm_(MPI_COMM_WORLD), owns_mpi_(true) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    // Threads: rannc-exec's watchdog may call MPI_Abort while the main thread
    // waits in a receive.
    int provided = 0;
    if (!initialized) MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    // Errors come back as codes so they surface as exceptions with a message.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  /// Wraps a communicator split off another one.
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm), owns_mpi_(false) {
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }

  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (owns_mpi_) MPI_Finalize();
    else MPI_Comm_free(&comm_);
  }

  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub;
    check(MPI_Comm_split(comm_, color, key, &sub), "MPI_Comm_split");
    return std::make_unique<MpiCommunicator>(sub);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  MPI_Comm handle() const { return comm_; }

  void sendBytes(Payload payload, int dst, int tag) override {
    requireHost(payload.memory, "a message");
    checkMessageSize(payload.size);
    reapSends();
    pending_.push_back({MPI_REQUEST_NULL, std::move(payload.owner), tag});
    check(MPI_Isend(payload.data, static_cast<int>(payload.size), MPI_BYTE, dst, tag, comm_,
                    &pending_.back().request),
          "MPI_Isend");
  }

  std::string recv(int src, int tag) override {
    const int count = probe(src, tag);
    std::string buf(static_cast<size_t>(count), '\0');
    check(MPI_Recv(buf.data(), count, MPI_BYTE, src, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    reapSends();
    return buf;
  }

  void recvInto(void *data, size_t size, Memory memory, int src, int tag) override {
    requireHost(memory, "a message");
    checkMessageSize(size);
    const int count = probe(src, tag);
    if (static_cast<size_t>(count) != size)
      throw std::runtime_error("expected a message of " + std::to_string(size) + " bytes from rank " +
                               std::to_string(src) + ", got " + std::to_string(count));
    check(MPI_Recv(data, count, MPI_BYTE, src, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
    reapSends();
  }

  // An MPI send returns at once and a receive waits only for its own
  // message, so messages that depend on each other need no bracket.
  void groupStart() override {}
  void groupEnd() override {}

  void waitSends() override {
    for (auto &p : pending_) check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait");
    pending_.clear();
  }

  void waitSendsTagged(int tag) override {
    for (auto &p : pending_)
      if (p.tag == tag) check(MPI_Wait(&p.request, MPI_STATUS_IGNORE), "MPI_Wait");
    std::erase_if(pending_, [tag](const Pending &p) { return p.tag == tag; });
  }

  void broadcast(void *data, size_t bytes, int root) override {
    check(MPI_Bcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_), "MPI_Bcast");
  }

  void allReduce(Buffer buf, ReduceOp op) override {
    requireHost(buf.memory, "an all-reduce");
    for (int64_t off = 0; off < buf.count; off += kChunk)
      check(MPI_Allreduce(MPI_IN_PLACE, at(buf, off), static_cast<int>(std::min(kChunk, buf.count - off)),
                          toMpi(buf.dtype), toMpi(op), comm_),
            "MPI_Allreduce");
  }

  std::unique_ptr<Request> startAllReduce(Buffer buf, ReduceOp op) override {
    requireHost(buf.memory, "an all-reduce");
    auto req = std::make_unique<MpiRequest>();
    for (int64_t off = 0; off < buf.count; off += kChunk) {
      req->requests.push_back(MPI_REQUEST_NULL);
      check(MPI_Iallreduce(MPI_IN_PLACE, at(buf, off), static_cast<int>(std::min(kChunk, buf.count - off)),
                           toMpi(buf.dtype), toMpi(op), comm_, &req->requests.back()),
            "MPI_Iallreduce");
    }
    return req;
  }

  std::unique_ptr<Request> startReduceScatter(Buffer buf) override {
    requireHost(buf.memory, "a reduce-scatter");
    auto req = std::make_unique<MpiRequest>();
    req->requests.push_back(MPI_REQUEST_NULL);
    check(MPI_Ireduce_scatter_block(MPI_IN_PLACE, buf.data, blockCount(buf), toMpi(buf.dtype), MPI_SUM, comm_,
                                    &req->requests.back()),
          "MPI_Ireduce_scatter_block");
    return req;
  }

  std::unique_ptr<Request> startAllGather(Buffer buf) override {
    requireHost(buf.memory, "an all-gather");
    auto req = std::make_unique<MpiRequest>();
    req->requests.push_back(MPI_REQUEST_NULL);
    check(MPI_Iallgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, buf.data, blockCount(buf), toMpi(buf.dtype), comm_,
                         &req->requests.back()),
          "MPI_Iallgather");
    return req;
  }

  void barrier() override { check(MPI_Barrier(comm_), "MPI_Barrier"); }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(MPI_COMM_WORLD, code);
    std::_Exit(code); // MPI_Abort does not return; this satisfies [[noreturn]]
  }

private:
  /// The elements per rank of `buf`, size() equal blocks.
  int blockCount(const Buffer &buf) const {
    if (buf.count % size_ != 0)
      throw std::logic_error("a collective of " + std::to_string(buf.count) + " elements in " +
                             std::to_string(size_) + " equal blocks");
    const int64_t block = buf.count / size_;
    if (block >= kChunk * 2) throw std::runtime_error("a collective block of 2^31 floats or more");
    return static_cast<int>(block);
  }

  /// The byte size of the next message from `src` with `tag` (waits for it).
  int probe(int src, int tag) {
    MPI_Status status;
    check(MPI_Probe(src, tag, comm_, &status), "MPI_Probe");
    int count = 0;
    MPI_Get_count(&status, MPI_BYTE, &count);
    return count;
  }

  /// Drops the sends that have completed, so each buffer goes as soon as its
  /// peer has it rather than at the end of the step (1F1B's memory bound).
  /// Testing also lets MPI move large messages, which it does only inside
  /// MPI calls.
  void reapSends() {
    size_t kept = 0;
    for (size_t i = 0; i < pending_.size(); ++i) {
      int done = 0;
      check(MPI_Test(&pending_[i].request, &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) pending_[kept++] = std::move(pending_[i]);
    }
    pending_.resize(kept);
  }

  struct Pending {
    MPI_Request request;
    std::shared_ptr<const void> owner; // keeps the buffer alive
    int tag = 0;
  };
  MPI_Comm comm_;
  bool owns_mpi_;
  int rank_ = 0, size_ = 1;
  std::vector<Pending> pending_;
};

} // namespace

std::string mpiLibraryVersion() {
  char text[MPI_MAX_LIBRARY_VERSION_STRING];
  int len = 0;
  if (MPI_Get_library_version(text, &len) != MPI_SUCCESS) return "unknown";
  std::string v(text, size_t(len));
  v = v.substr(0, v.find_first_of("\n,"));
  while (!v.empty() && (v.back() == ' ' || v.back() == '\0')) v.pop_back();
  return v;
}

MPI_Comm mpiHandle(Communicator &c) {
  auto *mpi = dynamic_cast<MpiCommunicator *>(&c);
  if (!mpi) throw std::logic_error("not an MPI communicator");
  return mpi->handle();
}

std::unique_ptr<Communicator> createMpiCommunicator(int *argc, char ***argv) {
  return std::make_unique<MpiCommunicator>(argc, argv);
}

} // namespace rannc::comm
