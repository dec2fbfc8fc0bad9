// Communication of device (CUDA) memory: NCCL where the CUDA toolkit was found
// at build time. Bootstrapped over the host communicator (the NCCL unique id
// travels over MPI). Only nccl_comm.cpp includes nccl.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "executor/comm/comm.h"

namespace rannc::comm {

/// Point-to-point and all-reduce on device buffers, in stream order.
class DeviceCommunicator {
public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  /// Sends `bytes` bytes of device memory at `buf` to `dst` (the receiver
  /// must post a recv of the same size). Sends and receives that depend on
  /// each other (a rank sending to itself, two ranks exchanging) must be
  /// issued between groupStart() and groupEnd(), or NCCL blocks on the first.
  virtual void send(const void *buf, size_t bytes, int dst) = 0;
  virtual void recv(void *buf, size_t bytes, int src) = 0;
  /// Brackets sends and receives that NCCL must issue together (ncclGroupStart/End).
  virtual void groupStart() = 0;
  virtual void groupEnd() = 0;
  /// In-place sum of `count` floats of device memory over all ranks.
  virtual void allReduceSum(float *buf, int64_t count) = 0;
  /// Waits until every operation issued so far has finished.
  virtual void synchronize() = 0;
};

/// True when this build has the NCCL implementation.
bool ncclCompiled();
/// The NCCL library's version ("2.30.7"), or "not compiled".
std::string ncclVersion();
/// Number of CUDA devices visible to this process (0 without CUDA or GPUs).
int visibleCudaDevices();
/// An NCCL communicator over the same ranks as `host`, on CUDA device
/// `device`. Throws std::runtime_error when NCCL or the device is missing.
std::unique_ptr<DeviceCommunicator> createNcclCommunicator(Communicator &host, int device);

} // namespace rannc::comm
