#include "executor/train/transport.h"

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
  // backward anyway, so a send costs no memory of its own; the stage keeps
  // them dense (Note [dense sent values] in executor/runtime/stage.cpp), so
  // the contiguous() below copies only what other paths hand it. What could
  // outlive its micro-batch is a sent gradient whose receiver is not ready
  // yet, or a recomputing stage's sent
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
      if (t.nbytes() > 0) comm_.recvInto(t.data_ptr(), t.nbytes(), comm::Memory::Host, src, tag);
      out.push_back(t.to(device_));
    }
    return out;
  }
  void waitSends() override { comm_.waitSends(); }
  void waitSendsTagged(int tag) override { comm_.waitSendsTagged(tag); }

private:
  comm::Communicator &comm_;
  torch::Device device_;
};

class NcclTransport final : public Transport {
public:
  NcclTransport(comm::Communicator &comm, torch::Device device,
                std::vector<std::unique_ptr<comm::Communicator>> channels)
      : comm_(comm), device_(device), channels_(std::move(channels)) {}

  // A group waits for the computation queued before it (the sent tensors are
  // computed, the received ones' memory is free), computation waits for the
  // received tensors, and the channel keeps each sent tensor until its send
  // is done (Note [device streams]).
  void send(const std::vector<std::pair<torch::Tensor, int>> &pieces, int tag) override {
    comm::Communicator &ch = channel(tag);
    std::vector<torch::Tensor> tensors;
    for (const auto &[t, dst] : pieces) {
      torch::Tensor c = t.detach().to(device_).contiguous(); // a CPU scalar too: NCCL reads device memory
      comm_.send(std::make_shared<const std::string>(runtime::packTensorHeader(c)), dst, tag);
      tensors.push_back(c);
    }
    ch.groupStart();
    for (size_t i = 0; i < pieces.size(); ++i)
      if (tensors[i].nbytes() > 0)
        ch.sendBytes(comm::Payload{tensors[i].data_ptr(), tensors[i].nbytes(),
                                   std::make_shared<const torch::Tensor>(tensors[i]), comm::Memory::Device},
                     pieces[i].second, tag);
    ch.groupEnd();
  }

  std::vector<torch::Tensor> recv(const std::vector<int> &srcs, int tag) override {
    comm::Communicator &ch = channel(tag);
    std::vector<torch::Tensor> out;
    for (int src : srcs) out.push_back(runtime::emptyFromHeader(comm_.recv(src, tag), device_));
    ch.groupStart();
    for (size_t i = 0; i < srcs.size(); ++i)
      if (out[i].nbytes() > 0) ch.recvInto(out[i].data_ptr(), out[i].nbytes(), comm::Memory::Device, srcs[i], tag);
    ch.groupEnd();
    return out;
  }

  void waitSends() override {
    comm_.waitSends();
    for (auto &ch : channels_) ch->waitSends();
  }
  void waitSendsTagged(int tag) override {
    comm_.waitSendsTagged(tag);
    channel(tag).waitSends();
  }

private:
  comm::Communicator &channel(int tag) { return *channels_[size_t(tag) % channels_.size()]; }

  comm::Communicator &comm_;
  torch::Device device_;
  std::vector<std::unique_ptr<comm::Communicator>> channels_;
};

} // namespace

std::unique_ptr<Transport> hostTransport(comm::Communicator &comm, torch::Device device) {
  return std::make_unique<HostTransport>(comm, device);
}

std::unique_ptr<Transport> ncclTransport(comm::Communicator &comm, torch::Device device,
                                         std::vector<std::unique_ptr<comm::Communicator>> channels) {
  if (channels.empty()) throw std::logic_error("ncclTransport: no channels");
  return std::make_unique<NcclTransport>(comm, device, std::move(channels));
}

} // namespace rannc::train
