// The NCCL implementation, compiled only when the CUDA toolkit is present.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

#include "executor/comm/device_comm.h"

namespace rannc::comm {
namespace {

void checkCuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void checkNccl(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

/// A CUDA event without timing, recorded on `stream` at construction.
class Event {
public:
  explicit Event(cudaStream_t stream) {
    checkCuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    checkCuda(cudaEventRecord(event_, stream), "cudaEventRecord");
  }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
  bool done() const {
    const cudaError_t e = cudaEventQuery(event_);
    if (e == cudaErrorNotReady) return false;
    checkCuda(e, "cudaEventQuery");
    return true;
  }
  /// `stream`'s later work waits for the event.
  void block(cudaStream_t stream) const { checkCuda(cudaStreamWaitEvent(stream, event_, 0), "cudaStreamWaitEvent"); }

private:
  cudaEvent_t event_ = nullptr;
};

ncclRedOp_t ncclOp(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

/// A collective on the NCCL stream: done when its event is; wait() orders the
/// compute stream after it (Note [device streams]).
class NcclRequest final : public Request {
public:
  NcclRequest(cudaStream_t nccl, cudaStream_t compute) : done_(nccl), compute_(compute) {}
  bool test() override { return done_.done(); }
  void wait() override { done_.block(compute_); }

private:
  Event done_;
  cudaStream_t compute_;
};

/// A collective staged through host memory: the device floats were copied
/// out when it started; wait() finishes the host collective and copies the
/// result back, finished when it returns.
class StagedRequest final : public Request {
public:
  StagedRequest(std::vector<float> host, std::unique_ptr<Request> inner, float *device, size_t back_count,
                cudaStream_t compute)
      : host_(std::move(host)), inner_(std::move(inner)), device_(device), count_(back_count), compute_(compute) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    checkCuda(cudaMemcpyAsync(device_, host_.data(), count_ * sizeof(float), cudaMemcpyHostToDevice, compute_),
              "cudaMemcpyAsync");
    checkCuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize"); // host_ may go now
  }

private:
  std::vector<float> host_;
  std::unique_ptr<Request> inner_;
  float *device_;
  size_t count_;
  cudaStream_t compute_;
};

/// Host memory through `host`; device memory over NCCL on a stream of its
/// own, or, without NCCL, collectives staged through host memory.
class CudaCommunicator final : public Communicator {
public:
  CudaCommunicator(std::unique_ptr<Communicator> host, int device, void *stream, bool nccl)
      : host_(std::move(host)), compute_(static_cast<cudaStream_t>(stream)) {
    if (!nccl) return;
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    // Rank 0 makes the unique id and broadcasts its bytes over MPI.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank() == 0) checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host_->broadcast(&id, sizeof id, 0);
    checkNccl(ncclCommInitRank(&nccl_, size(), id, rank()), "ncclCommInitRank");
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  ~CudaCommunicator() override {
    if (!nccl_) return;
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(nccl_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }

  void sendBytes(Payload payload, int dst, int tag) override {
    if (payload.memory == Memory::Host) return host_->sendBytes(std::move(payload), dst, tag);
    requireNccl("a device message");
    if (group_depth_ == 0) waitForCompute();
    checkNccl(ncclSend(payload.data, payload.size, ncclUint8, dst, nccl_, stream_), "ncclSend");
    group_owners_.push_back(std::move(payload.owner));
    if (group_depth_ == 0) issued();
  }

  std::string recv(int src, int tag) override { return host_->recv(src, tag); }

  void recvInto(void *data, size_t size, Memory memory, int src, int tag) override {
    if (memory == Memory::Host) return host_->recvInto(data, size, memory, src, tag);
    requireNccl("a device message");
    if (group_depth_ == 0) waitForCompute();
    checkNccl(ncclRecv(data, size, ncclUint8, src, nccl_, stream_), "ncclRecv");
    group_received_ = true;
    if (group_depth_ == 0) issued();
  }

  void groupStart() override {
    host_->groupStart();
    if (!nccl_) return;
    if (group_depth_++ > 0) return;
    waitForCompute(); // the sent tensors are computed, the received ones' memory free
    checkNccl(ncclGroupStart(), "ncclGroupStart");
  }

  void groupEnd() override {
    host_->groupEnd();
    if (!nccl_) return;
    if (group_depth_ == 0) throw std::logic_error("groupEnd without groupStart");
    if (--group_depth_ > 0) return;
    checkNccl(ncclGroupEnd(), "ncclGroupEnd");
    issued();
  }

  void waitSends() override {
    host_->waitSends();
    if (!nccl_) return;
    checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
    pending_.clear();
  }

  void allReduce(Buffer buf, ReduceOp op) override {
    if (buf.memory == Memory::Host) return host_->allReduce(buf, op);
    startAllReduce(buf, op)->wait();
  }

  std::unique_ptr<Request> startAllReduce(Buffer buf, ReduceOp op) override {
    if (buf.memory == Memory::Host) return host_->startAllReduce(buf, op);
    float *data = deviceFloats(buf, false);
    if (nccl_) return onNccl([&] {
      checkNccl(ncclAllReduce(data, data, size_t(buf.count), ncclFloat32, ncclOp(op), nccl_, stream_),
                "ncclAllReduce");
    });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startAllReduce(Buffer::host(host.data(), buf.count), op);
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, size_t(buf.count), compute_);
  }

  std::unique_ptr<Request> startReduceScatter(Buffer buf) override {
    if (buf.memory == Memory::Host) return host_->startReduceScatter(buf);
    float *data = deviceFloats(buf, true);
    const int64_t block = buf.count / size();
    if (nccl_) return onNccl([&] {
      // In place: NCCL's output is the rank's block of its own input.
      const int64_t mine = int64_t(rank()) * block;
      checkNccl(ncclReduceScatter(data, data + mine, size_t(block), ncclFloat32, ncclSum, nccl_, stream_),
                "ncclReduceScatter");
      // Communicator's contract: this rank's sums at the front.
      if (rank() > 0)
        checkCuda(cudaMemcpyAsync(data, data + mine, size_t(block) * sizeof(float), cudaMemcpyDeviceToDevice,
                                  stream_),
                  "cudaMemcpyAsync");
    });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startReduceScatter(Buffer::host(host.data(), buf.count));
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, size_t(block), compute_);
  }

  std::unique_ptr<Request> startAllGather(Buffer buf) override {
    if (buf.memory == Memory::Host) return host_->startAllGather(buf);
    float *data = deviceFloats(buf, true);
    const int64_t block = buf.count / size();
    if (nccl_) return onNccl([&] {
      checkNccl(ncclAllGather(data + int64_t(rank()) * block, data, size_t(block), ncclFloat32, nccl_, stream_),
                "ncclAllGather");
    });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startAllGather(Buffer::host(host.data(), buf.count));
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, size_t(buf.count), compute_);
  }

  void barrier() override { host_->barrier(); }
  void broadcast(void *data, size_t bytes, int root) override { host_->broadcast(data, bytes, root); }
  std::unique_ptr<Communicator> split(int color, int key) override { return host_->split(color, key); }
  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::abort(); // not reached: the host communicator stops the job
  }

private:
  void requireNccl(const char *what) const {
    if (!nccl_)
      throw std::logic_error(std::string(what) + " needs NCCL (this device communicator stages through host memory)");
  }
  /// The float pointer of a device buffer; `blocks`: of size() equal blocks.
  float *deviceFloats(const Buffer &buf, bool blocks) const {
    if (buf.dtype != DType::Float32) throw std::logic_error("device collectives take float32 buffers only");
    if (blocks && buf.count % size() != 0)
      throw std::logic_error("a device collective of " + std::to_string(buf.count) + " floats over " +
                             std::to_string(size()) + " ranks");
    return static_cast<float *>(buf.data);
  }
  /// The NCCL stream's later work waits for what the compute stream has queued.
  void waitForCompute() { Event(compute_).block(stream_); }

  /// After device messages were issued (alone or as a group): the compute
  /// stream waits for received ones; sent payloads are kept until done.
  void issued() {
    if (group_received_) Event(stream_).block(compute_);
    group_received_ = false;
    if (!group_owners_.empty()) {
      pending_.push_back(Pending{std::move(group_owners_), std::make_unique<Event>(stream_)});
      group_owners_.clear();
      while (!pending_.empty() && pending_.front().done->done()) pending_.pop_front();
    }
  }

  /// Issues `op` on the NCCL stream after the compute stream's queued work.
  template <typename Op> std::unique_ptr<Request> onNccl(Op op) {
    waitForCompute();
    op();
    return std::make_unique<NcclRequest>(stream_, compute_);
  }

  std::vector<float> toHost(const float *device, size_t count) {
    std::vector<float> host(count);
    checkCuda(cudaMemcpyAsync(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost, compute_),
              "cudaMemcpyAsync");
    checkCuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    return host;
  }

  /// Sent payloads the NCCL stream may still read.
  struct Pending {
    std::vector<std::shared_ptr<const void>> owners;
    std::unique_ptr<Event> done;
  };

  std::unique_ptr<Communicator> host_;
  cudaStream_t compute_;
  ncclComm_t nccl_ = nullptr;   ///< null: device collectives staged through host memory
  cudaStream_t stream_ = nullptr; ///< NCCL's stream
  int group_depth_ = 0;
  bool group_received_ = false; ///< device messages received since the last issued()
  std::vector<std::shared_ptr<const void>> group_owners_; ///< payloads sent since the last issued()
  std::deque<Pending> pending_;
};

} // namespace

bool ncclCompiled() { return true; }

std::string ncclVersion() {
  int v = 0;
  if (ncclGetVersion(&v) != ncclSuccess) return "unknown";
  // NCCL 2.9+ encodes X*10000 + Y*100 + Z.
  return std::to_string(v / 10000) + "." + std::to_string(v / 100 % 100) + "." + std::to_string(v % 100);
}

int visibleCudaDevices() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator> host, int gpu, void *stream,
                                                       bool nccl) {
  if (nccl) {
    const int n = visibleCudaDevices();
    if (gpu < 0 || gpu >= n)
      throw std::runtime_error("CUDA device " + std::to_string(gpu) + " is not visible (" + std::to_string(n) +
                               " device(s))");
  }
  return std::make_unique<CudaCommunicator>(std::move(host), gpu, stream, nccl);
}

} // namespace rannc::comm
