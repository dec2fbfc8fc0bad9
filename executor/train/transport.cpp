#include "executor/train/transport.h"

#include <deque>

#include "executor/runtime/stage.h"

namespace rannc::train {
namespace {

class HostTransport final : public Transport {
public:
  HostTransport(comm::Communicator &comm, torch::Device device) : comm_(comm), device_(device) {}
  // Note [send buffers]: a tensor goes as two messages, its dtype and shape,
  // then its bytes straight from its own memory; the communicator holds a
  // reference until the transfer completes and lets go at its next call. On
  // the CPU a sent value is the stage's own tensor, which it keeps for
  // backward anyway, so a send costs no memory of its own (a non-contiguous
  // one is copied first). What could outlive its micro-batch is a sent
  // gradient whose receiver is not ready yet, or a recomputing stage's sent
  // value, which it drops after sending. So the trainer waits for every
  // transfer before each backward (trainer.cpp), and the plan counts none at
  // a backward's peak; only a recomputing stage's newest sent values, still
  // in transit while it runs the next forward (the next stage is a forward
  // behind), are in its stash (Note [partition cost model]). The receiver
  // allocates the tensor from the header and MPI writes into it.
  // Both are tensor memory, in the logged peak with everything else.
  void send(const std::vector<std::pair<torch::Tensor, int>> &pieces, int tag) override {
    for (const auto &[t, dst] : pieces) {
      torch::Tensor c = t.detach().to(torch::kCPU).contiguous();
      comm_.send(std::make_shared<const std::string>(runtime::packTensorHeader(c)), dst, tag);
      if (c.nbytes() > 0)
        comm_.sendBytes(comm::Payload{c.data_ptr(), c.nbytes(), std::make_shared<const torch::Tensor>(c)}, dst, tag);
    }
  }
  std::vector<torch::Tensor> recv(const std::vector<int> &srcs, int tag) override {
    std::vector<torch::Tensor> out;
    for (int src : srcs) {
      torch::Tensor t = runtime::emptyFromHeader(comm_.recv(src, tag), torch::kCPU);
      if (t.nbytes() > 0) comm_.recvInto(t.data_ptr(), t.nbytes(), src, tag);
      out.push_back(t.to(device_));
    }
    return out;
  }
  void waitSends() override { comm_.waitSends(); }

private:
  comm::Communicator &comm_;
  torch::Device device_;
};

class NcclTransport final : public Transport {
public:
  NcclTransport(comm::Communicator &comm, torch::Device device,
                std::vector<std::unique_ptr<comm::DeviceCommunicator>> channels, void *stream)
      : comm_(comm), device_(device), channels_(std::move(channels)), stream_(stream) {}

  void send(const std::vector<std::pair<torch::Tensor, int>> &pieces, int tag) override {
    comm::DeviceCommunicator &ch = channel(tag);
    Pending p;
    for (const auto &[t, dst] : pieces) {
      torch::Tensor c = t.detach().to(device_).contiguous(); // a CPU scalar too: NCCL reads device memory
      comm_.send(std::make_shared<const std::string>(runtime::packTensorHeader(c)), dst, tag);
      p.tensors.push_back(c);
    }
    ch.waitFor(stream_); // the tensors are computed
    ch.groupStart();
    for (size_t i = 0; i < pieces.size(); ++i)
      if (p.tensors[i].nbytes() > 0) ch.send(p.tensors[i].data_ptr(), p.tensors[i].nbytes(), pieces[i].second);
    ch.groupEnd();
    p.mark = ch.mark();
    pending_.push_back(std::move(p));
    while (!pending_.empty() && pending_.front().mark->done()) pending_.pop_front();
  }

  std::vector<torch::Tensor> recv(const std::vector<int> &srcs, int tag) override {
    comm::DeviceCommunicator &ch = channel(tag);
    std::vector<torch::Tensor> out;
    for (int src : srcs) out.push_back(runtime::emptyFromHeader(comm_.recv(src, tag), device_));
    ch.waitFor(stream_); // earlier computation is done with the memory
    ch.groupStart();
    for (size_t i = 0; i < srcs.size(); ++i)
      if (out[i].nbytes() > 0) ch.recv(out[i].data_ptr(), out[i].nbytes(), srcs[i]);
    ch.groupEnd();
    ch.makeWait(stream_); // computation reads them after they arrived
    return out;
  }

  void waitSends() override {
    comm_.waitSends();
    for (auto &ch : channels_) ch->synchronize();
    pending_.clear();
  }

private:
  struct Pending {
    std::vector<torch::Tensor> tensors;
    std::unique_ptr<comm::DeviceMark> mark;
  };
  comm::DeviceCommunicator &channel(int tag) { return *channels_[size_t(tag) % channels_.size()]; }

  comm::Communicator &comm_;
  torch::Device device_;
  std::vector<std::unique_ptr<comm::DeviceCommunicator>> channels_;
  void *stream_;
  std::deque<Pending> pending_; ///< sends whose tensors the channels may still read
};

} // namespace

std::unique_ptr<Transport> hostTransport(comm::Communicator &comm, torch::Device device) {
  return std::make_unique<HostTransport>(comm, device);
}

std::unique_ptr<Transport> ncclTransport(comm::Communicator &comm, torch::Device device,
                                         std::vector<std::unique_ptr<comm::DeviceCommunicator>> channels,
                                         void *stream) {
  if (channels.empty()) throw std::logic_error("ncclTransport: no channels");
  return std::make_unique<NcclTransport>(comm, device, std::move(channels), stream);
}

} // namespace rannc::train
