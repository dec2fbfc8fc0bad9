// The device communicator's logic, over the calls of DeviceApi (Note
// [NCCL-facing interface]): the same lines run with CUDA and NCCL, and in
// the rehearsal on the CPU.
#include "executor/comm/device_comm.h"

#include <cstdlib>
#include <deque>
#include <stdexcept>
#include <string>
#include <vector>

namespace rannc::comm {
namespace {

/// An event recorded on `stream` at construction.
class Event {
public:
  Event(DeviceApi &api, void *stream) : api_(api), event_(api.recordEvent(stream)) {}
  ~Event() { api_.destroyEvent(event_); }
  Event(const Event &) = delete;
  Event &operator=(const Event &) = delete;
  bool done() const { return api_.eventDone(event_); }
  /// `stream`'s later work waits for the event.
  void block(void *stream) const { api_.streamWaitEvent(stream, event_); }

private:
  DeviceApi &api_;
  void *event_;
};

/// A collective on the NCCL stream: done when its event is; wait() orders the
/// compute stream after it (Note [device streams]).
class NcclRequest final : public Request {
public:
  NcclRequest(DeviceApi &api, void *nccl, void *compute) : done_(api, nccl), compute_(compute) {}
  bool test() override { return done_.done(); }
  void wait() override { done_.block(compute_); }

private:
  Event done_;
  void *compute_;
};

/// A collective staged through host memory: the device floats were copied
/// out when it started; wait() finishes the host collective and copies the
/// result back, finished when it returns.
class StagedRequest final : public Request {
public:
  StagedRequest(DeviceApi &api, std::vector<float> host, std::unique_ptr<Request> inner, float *device,
                size_t back_count, void *compute)
      : api_(api), host_(std::move(host)), inner_(std::move(inner)), device_(device), count_(back_count),
        compute_(compute) {}
  bool test() override { return inner_->test(); }
  void wait() override {
    if (!inner_) return;
    inner_->wait();
    inner_.reset();
    api_.copy(device_, host_.data(), count_ * sizeof(float), compute_);
    api_.synchronize(compute_); // host_ may go now
  }

private:
  DeviceApi &api_;
  std::vector<float> host_;
  std::unique_ptr<Request> inner_;
  float *device_;
  size_t count_;
  void *compute_;
};

/// Host memory through `host`; device memory over NCCL on a stream of its
/// own, or, without NCCL, collectives staged through host memory.
class DeviceCommunicator final : public Communicator {
public:
  DeviceCommunicator(std::unique_ptr<Communicator> host, std::shared_ptr<DeviceApi> api, void *stream, bool nccl)
      : host_(std::move(host)), api_(std::move(api)), compute_(stream) {
    if (!nccl) return;
    nccl_ = api_->initComm(*host_);
    stream_ = api_->createStream();
  }

  ~DeviceCommunicator() override {
    if (!nccl_) return;
    try {
      api_->synchronize(stream_);
    } catch (...) { // a failed job is stopping: nothing left to wait for
    }
    pending_.clear();
    nccl_.reset();
    api_->destroyStream(stream_);
  }

  int rank() const override { return host_->rank(); }
  int size() const override { return host_->size(); }
  /// The device's memory is the host's (the rehearsal).
  bool deviceIsHost() const { return api_->deviceMemoryIsHost(); }

  void sendBytes(Payload payload, int dst, int tag) override {
    if (payload.memory == Memory::Host) return host_->sendBytes(std::move(payload), dst, tag);
    requireNccl("a device message");
    if (group_depth_ == 0) waitForCompute();
    nccl_->send(payload.data, payload.size, dst, stream_);
    group_owners_.push_back(std::move(payload.owner));
    if (group_depth_ == 0) issued();
  }

  std::string recv(int src, int tag) override { return host_->recv(src, tag); }

  void recvInto(void *data, size_t size, Memory memory, int src, int tag) override {
    if (memory == Memory::Host) return host_->recvInto(data, size, memory, src, tag);
    requireNccl("a device message");
    if (group_depth_ == 0) waitForCompute();
    nccl_->recv(data, size, src, stream_);
    group_received_ = true;
    if (group_depth_ == 0) issued();
  }

  void groupStart() override {
    host_->groupStart();
    if (!nccl_) return;
    if (group_depth_++ > 0) return;
    waitForCompute(); // the sent tensors are computed, the received ones' memory free
    api_->groupStart();
  }

  void groupEnd() override {
    host_->groupEnd();
    if (!nccl_) return;
    if (group_depth_ == 0) throw std::logic_error("groupEnd without groupStart");
    if (--group_depth_ > 0) return;
    api_->groupEnd();
    issued();
  }

  void waitSends() override {
    host_->waitSends();
    if (!nccl_) return;
    api_->synchronize(stream_);
    pending_.clear();
  }

  void waitSendsTagged(int tag) override {
    host_->waitSendsTagged(tag);
    if (!nccl_) return;
    api_->synchronize(stream_); // device messages carry no tag
    pending_.clear();
  }

  void allReduce(Buffer buf, ReduceOp op) override {
    if (buf.memory == Memory::Host) return host_->allReduce(buf, op);
    startAllReduce(buf, op)->wait();
  }

  std::unique_ptr<Request> startAllReduce(Buffer buf, ReduceOp op) override {
    if (buf.memory == Memory::Host) return host_->startAllReduce(buf, op);
    float *data = deviceFloats(buf, false);
    if (nccl_) return onNccl([&] { nccl_->allReduce(data, size_t(buf.count), op, stream_); });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startAllReduce(Buffer::host(host.data(), buf.count), op);
    return std::make_unique<StagedRequest>(*api_, std::move(host), std::move(inner), data, size_t(buf.count),
                                           compute_);
  }

  std::unique_ptr<Request> startReduceScatter(Buffer buf) override {
    if (buf.memory == Memory::Host) return host_->startReduceScatter(buf);
    float *data = deviceFloats(buf, true);
    const int64_t block = buf.count / size();
    if (nccl_) return onNccl([&] {
      // In place: NCCL's output is the rank's block of its own input.
      const int64_t mine = int64_t(rank()) * block;
      nccl_->reduceScatter(data, data + mine, size_t(block), stream_);
      // Communicator's contract: this rank's sums at the front.
      if (rank() > 0) api_->copy(data, data + mine, size_t(block) * sizeof(float), stream_);
    });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startReduceScatter(Buffer::host(host.data(), buf.count));
    return std::make_unique<StagedRequest>(*api_, std::move(host), std::move(inner), data, size_t(block),
                                           compute_);
  }

  std::unique_ptr<Request> startAllGather(Buffer buf) override {
    if (buf.memory == Memory::Host) return host_->startAllGather(buf);
    float *data = deviceFloats(buf, true);
    const int64_t block = buf.count / size();
    if (nccl_) return onNccl([&] { nccl_->allGather(data + int64_t(rank()) * block, data, size_t(block), stream_); });
    auto host = toHost(data, size_t(buf.count));
    auto inner = host_->startAllGather(Buffer::host(host.data(), buf.count));
    return std::make_unique<StagedRequest>(*api_, std::move(host), std::move(inner), data, size_t(buf.count),
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
  void waitForCompute() { Event(*api_, compute_).block(stream_); }

  /// After device messages were issued (alone or as a group): the compute
  /// stream waits for received ones; sent payloads are kept until done.
  void issued() {
    if (group_received_) Event(*api_, stream_).block(compute_);
    group_received_ = false;
    if (!group_owners_.empty()) {
      pending_.push_back(Pending{std::move(group_owners_), std::make_unique<Event>(*api_, stream_)});
      group_owners_.clear();
      while (!pending_.empty() && pending_.front().done->done()) pending_.pop_front();
    }
  }

  /// Issues `op` on the NCCL stream after the compute stream's queued work.
  template <typename Op> std::unique_ptr<Request> onNccl(Op op) {
    waitForCompute();
    op();
    return std::make_unique<NcclRequest>(*api_, stream_, compute_);
  }

  std::vector<float> toHost(const float *device, size_t count) {
    std::vector<float> host(count);
    api_->copy(host.data(), device, count * sizeof(float), compute_);
    api_->synchronize(compute_);
    return host;
  }

  /// Sent payloads the NCCL stream may still read.
  struct Pending {
    std::vector<std::shared_ptr<const void>> owners;
    std::unique_ptr<Event> done;
  };

  std::unique_ptr<Communicator> host_;
  std::shared_ptr<DeviceApi> api_;
  void *compute_;
  std::unique_ptr<NcclComm> nccl_; ///< null: device collectives staged through host memory
  void *stream_ = nullptr;         ///< NCCL's stream
  int group_depth_ = 0;
  bool group_received_ = false; ///< device messages received since the last issued()
  std::vector<std::shared_ptr<const void>> group_owners_; ///< payloads sent since the last issued()
  std::deque<Pending> pending_;
};

} // namespace

Memory tensorMemory(const Communicator &group, bool on_gpu) {
  const auto *device = dynamic_cast<const DeviceCommunicator *>(&group);
  return on_gpu || (device && device->deviceIsHost()) ? Memory::Device : Memory::Host;
}

std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator> host,
                                                       std::shared_ptr<DeviceApi> api, void *stream, bool nccl) {
  return std::make_unique<DeviceCommunicator>(std::move(host), std::move(api), stream, nccl);
}

} // namespace rannc::comm
