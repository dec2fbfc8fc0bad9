// The NCCL implementation, compiled only when the CUDA toolkit is present.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "executor/comm/device_comm.h"

namespace rannc::comm {
namespace {

void checkCuda(cudaError_t e, const char *what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

void checkNccl(ncclResult_t r, const char *what) {
  if (r != ncclSuccess) throw std::runtime_error(std::string(what) + ": " + ncclGetErrorString(r));
}

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

  void allReduceSum(float *buf, int64_t count) override {
    checkNccl(ncclAllReduce(buf, buf, size_t(count), ncclFloat32, ncclSum, comm_, stream_), "ncclAllReduce");
  }

  void synchronize() override { checkCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

private:
  int rank_, size_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
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

} // namespace rannc::comm
