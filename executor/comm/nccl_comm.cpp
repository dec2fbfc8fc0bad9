// The NCCL implementation, compiled only when the CUDA toolkit is present.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdlib>
#include <cstring>
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

cudaStream_t asStream(void *s) { return static_cast<cudaStream_t>(s); }

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

class EventMark final : public DeviceMark {
public:
  explicit EventMark(cudaStream_t stream) : event_(stream) {}
  bool done() override { return event_.done(); }

private:
  Event event_;
};

ncclRedOp_t ncclOp(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

class NcclCommunicator final : public DeviceCommunicator {
public:
  NcclCommunicator(Communicator &host, int device) : rank_(host.rank()), size_(host.size()) {
    checkCuda(cudaSetDevice(device), "cudaSetDevice");
    // Rank 0 makes the unique id and broadcasts its bytes over MPI.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (rank_ == 0) checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    checkNccl(ncclCommInitRank(&comm_, size_, id, rank_), "ncclCommInitRank");
    checkCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
  }

  ~NcclCommunicator() override {
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaStreamDestroy(stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void send(const void *buf, size_t bytes, int dst) override {
    checkNccl(ncclSend(buf, bytes, ncclUint8, dst, comm_, stream_), "ncclSend");
  }

  void recv(void *buf, size_t bytes, int src) override {
    checkNccl(ncclRecv(buf, bytes, ncclUint8, src, comm_, stream_), "ncclRecv");
  }

  void groupStart() override { checkNccl(ncclGroupStart(), "ncclGroupStart"); }
  void groupEnd() override { checkNccl(ncclGroupEnd(), "ncclGroupEnd"); }

  void allReduce(float *buf, int64_t count, ReduceOp op) override {
    checkNccl(ncclAllReduce(buf, buf, size_t(count), ncclFloat32, ncclOp(op), comm_, stream_), "ncclAllReduce");
  }

  void reduceScatterSum(float *buf, int64_t block) override {
    // In place: NCCL's output is the rank's block of its own input.
    checkNccl(ncclReduceScatter(buf, buf + int64_t(rank_) * block, size_t(block), ncclFloat32, ncclSum, comm_, stream_),
              "ncclReduceScatter");
  }

  void allGather(float *buf, int64_t block) override {
    checkNccl(ncclAllGather(buf + int64_t(rank_) * block, buf, size_t(block), ncclFloat32, comm_, stream_),
              "ncclAllGather");
  }

  void waitFor(void *stream) override { Event(asStream(stream)).block(stream_); }
  void makeWait(void *stream) override { Event(stream_).block(asStream(stream)); }
  std::unique_ptr<DeviceMark> mark() override { return std::make_unique<EventMark>(stream_); }
  void synchronize() override { checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }
  cudaStream_t stream() const { return stream_; }

private:
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
};

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
  StagedRequest(std::vector<float> host, std::unique_ptr<Request> inner, float *device, size_t back_offset,
                size_t back_count, cudaStream_t compute)
      : host_(std::move(host)), inner_(std::move(inner)), device_(device), offset_(back_offset), count_(back_count),
        compute_(compute) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    checkCuda(cudaMemcpyAsync(device_ + offset_, host_.data() + offset_, count_ * sizeof(float),
                              cudaMemcpyHostToDevice, compute_),
              "cudaMemcpyAsync");
    checkCuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize"); // host_ may go now
  }

private:
  std::vector<float> host_;
  std::unique_ptr<Request> inner_;
  float *device_;
  size_t offset_, count_;
  cudaStream_t compute_;
};

class DeviceCollectives final : public Communicator {
public:
  DeviceCollectives(std::unique_ptr<Communicator> host, std::unique_ptr<DeviceCommunicator> nccl, void *stream)
      : host_(std::move(host)), nccl_(std::move(nccl)), compute_(asStream(stream)) {}

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  void sendBytes(Payload payload, int dst, int tag) override { host_->sendBytes(std::move(payload), dst, tag); }
  std::string recv(int src, int tag) override { return host_->recv(src, tag); }
  void recvInto(void *data, size_t size, int src, int tag) override { host_->recvInto(data, size, src, tag); }
  void waitSends() override { host_->waitSends(); }
  void allReduce(double *data, int count, ReduceOp op) override { host_->allReduce(data, count, op); }
  void allReduce(float *data, int64_t count, ReduceOp op) override { startAllReduce(data, count, op)->wait(); }

  std::unique_ptr<Request> startAllReduce(float *data, int64_t count, ReduceOp op) override {
    if (nccl_) return onNccl([&] { nccl_->allReduce(data, count, op); });
    auto host = toHost(data, size_t(count));
    auto inner = host_->startAllReduce(host.data(), count, op);
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, 0, size_t(count), compute_);
  }

  std::unique_ptr<Request> startReduceScatter(float *data, int64_t block) override {
    if (nccl_)
      return onNccl([&] {
        nccl_->reduceScatterSum(data, block);
        // Communicator's contract: this rank's sums at the front.
        if (rank() > 0)
          checkCuda(cudaMemcpyAsync(data, data + int64_t(rank()) * block, size_t(block) * sizeof(float),
                                    cudaMemcpyDeviceToDevice, ncclStream()),
                    "cudaMemcpyAsync");
      });
    auto host = toHost(data, size_t(block) * size_t(size()));
    auto inner = host_->startReduceScatter(host.data(), block);
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, 0, size_t(block), compute_);
  }

  std::unique_ptr<Request> startAllGather(float *data, int64_t block) override {
    if (nccl_) return onNccl([&] { nccl_->allGather(data, block); });
    auto host = toHost(data, size_t(block) * size_t(size()));
    auto inner = host_->startAllGather(host.data(), block);
    return std::make_unique<StagedRequest>(std::move(host), std::move(inner), data, 0, size_t(block) * size_t(size()),
                                           compute_);
  }

  void barrier() override { host_->barrier(); }
  void broadcast(void *data, size_t bytes, int root) override { host_->broadcast(data, bytes, root); }
  std::unique_ptr<Communicator> split(int color, int key) override { return host_->split(color, key); }
  [[noreturn]] void abort(int code) override {
    host_->abort(code);
    std::abort(); // not reached: the host communicator stops the job
  }

private:
  /// Issues `op` on the NCCL stream after the compute stream's queued work.
  template <typename Op> std::unique_ptr<Request> onNccl(Op op) {
    nccl_->waitFor(compute_);
    op();
    return std::make_unique<NcclRequest>(ncclStream(), compute_);
  }
  /// The NCCL communicator's stream (a request's event is recorded there).
  cudaStream_t ncclStream() const { return static_cast<NcclCommunicator &>(*nccl_).stream(); }

  std::vector<float> toHost(const float *device, size_t count) {
    std::vector<float> host(count);
    checkCuda(cudaMemcpyAsync(host.data(), device, count * sizeof(float), cudaMemcpyDeviceToHost, compute_),
              "cudaMemcpyAsync");
    checkCuda(cudaStreamSynchronize(compute_), "cudaStreamSynchronize");
    return host;
  }

  std::unique_ptr<Communicator> host_;
  std::unique_ptr<DeviceCommunicator> nccl_;
  cudaStream_t compute_;
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

std::unique_ptr<DeviceCommunicator> createNcclCommunicator(Communicator &host, int device) {
  int n = visibleCudaDevices();
  if (device < 0 || device >= n)
    throw std::runtime_error("CUDA device " + std::to_string(device) + " is not visible (" + std::to_string(n) +
                             " device(s))");
  return std::make_unique<NcclCommunicator>(host, device);
}

std::unique_ptr<Communicator> deviceCollectives(std::unique_ptr<Communicator> host,
                                                std::unique_ptr<DeviceCommunicator> nccl, void *stream) {
  if (nccl && (nccl->size() != host->size() || nccl->rank() != host->rank()))
    throw std::logic_error("deviceCollectives: the NCCL communicator spans other ranks than the host one");
  if (nccl && !dynamic_cast<NcclCommunicator *>(nccl.get()))
    throw std::logic_error("deviceCollectives: needs the NCCL communicator of createNcclCommunicator");
  return std::make_unique<DeviceCollectives>(std::move(host), std::move(nccl), stream);
}

} // namespace rannc::comm
