// The NCCL implementation of DeviceApi (Note [NCCL-facing interface]),
// compiled only when the CUDA toolkit is present: each call is the CUDA or
// NCCL function it names, its error turned into an exception.
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

cudaStream_t cuda(void *stream) { return static_cast<cudaStream_t>(stream); }
cudaEvent_t cudaEvent(void *event) { return static_cast<cudaEvent_t>(event); }

ncclRedOp_t ncclOp(ReduceOp op) { return op == ReduceOp::Max ? ncclMax : ncclSum; }

class CudaNcclComm final : public NcclComm {
public:
  CudaNcclComm(Communicator &host) {
    // Rank 0 makes the unique id and broadcasts its bytes over MPI.
    ncclUniqueId id;
    std::memset(&id, 0, sizeof id);
    if (host.rank() == 0) checkNccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
    host.broadcast(&id, sizeof id, 0);
    checkNccl(ncclCommInitRank(&comm_, host.size(), id, host.rank()), "ncclCommInitRank");
  }
  ~CudaNcclComm() override { ncclCommDestroy(comm_); }

  void send(const void *data, size_t bytes, int peer, void *stream) override {
    checkNccl(ncclSend(data, bytes, ncclUint8, peer, comm_, cuda(stream)), "ncclSend");
  }
  void recv(void *data, size_t bytes, int peer, void *stream) override {
    checkNccl(ncclRecv(data, bytes, ncclUint8, peer, comm_, cuda(stream)), "ncclRecv");
  }
  void allReduce(float *data, size_t count, ReduceOp op, void *stream) override {
    checkNccl(ncclAllReduce(data, data, count, ncclFloat32, ncclOp(op), comm_, cuda(stream)), "ncclAllReduce");
  }
  void reduceScatter(const float *in, float *out, size_t block, void *stream) override {
    checkNccl(ncclReduceScatter(in, out, block, ncclFloat32, ncclSum, comm_, cuda(stream)), "ncclReduceScatter");
  }
  void allGather(const float *in, float *out, size_t block, void *stream) override {
    checkNccl(ncclAllGather(in, out, block, ncclFloat32, comm_, cuda(stream)), "ncclAllGather");
  }

private:
  ncclComm_t comm_ = nullptr;
};

class CudaApi final : public DeviceApi {
public:
  explicit CudaApi(int gpu) : gpu_(gpu) {}

  void *createStream() override {
    checkCuda(cudaSetDevice(gpu_), "cudaSetDevice");
    cudaStream_t s = nullptr;
    checkCuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    return s;
  }
  void destroyStream(void *stream) override { cudaStreamDestroy(cuda(stream)); }
  void *recordEvent(void *stream) override {
    cudaEvent_t e = nullptr;
    checkCuda(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreate");
    checkCuda(cudaEventRecord(e, cuda(stream)), "cudaEventRecord");
    return e;
  }
  void destroyEvent(void *event) override { cudaEventDestroy(cudaEvent(event)); }
  bool eventDone(void *event) override {
    const cudaError_t e = cudaEventQuery(cudaEvent(event));
    if (e == cudaErrorNotReady) return false;
    checkCuda(e, "cudaEventQuery");
    return true;
  }
  void streamWaitEvent(void *stream, void *event) override {
    checkCuda(cudaStreamWaitEvent(cuda(stream), cudaEvent(event), 0), "cudaStreamWaitEvent");
  }
  void synchronize(void *stream) override { checkCuda(cudaStreamSynchronize(cuda(stream)), "cudaStreamSynchronize"); }
  void copy(void *dst, const void *src, size_t bytes, void *stream) override {
    checkCuda(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cuda(stream)), "cudaMemcpyAsync");
  }
  void groupStart() override { checkNccl(ncclGroupStart(), "ncclGroupStart"); }
  void groupEnd() override { checkNccl(ncclGroupEnd(), "ncclGroupEnd"); }
  std::unique_ptr<NcclComm> initComm(Communicator &host) override {
    checkCuda(cudaSetDevice(gpu_), "cudaSetDevice");
    return std::make_unique<CudaNcclComm>(host);
  }

private:
  int gpu_;
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

std::shared_ptr<DeviceApi> cudaDevice(int gpu) {
  const int n = visibleCudaDevices();
  if (gpu < 0 || gpu >= n)
    throw std::runtime_error("CUDA device " + std::to_string(gpu) + " is not visible (" + std::to_string(n) +
                             " device(s))");
  return std::make_shared<CudaApi>(gpu);
}

std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator> host, int gpu, void *stream,
                                                       bool nccl) {
  // Without NCCL (ranks sharing a GPU) only copies run on the device.
  auto api = nccl ? cudaDevice(gpu) : std::make_shared<CudaApi>(gpu);
  return createDeviceCommunicator(std::move(host), std::move(api), stream, nccl);
}

} // namespace rannc::comm
