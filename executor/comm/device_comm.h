// Communicators that also reach CUDA device memory: NCCL where the CUDA
// toolkit was found at build time, bootstrapped over a host communicator
// (the NCCL unique id travels over MPI). Their logic (device_comm.cpp) calls
// CUDA and NCCL through DeviceApi (Note [NCCL-facing interface]); only
// nccl_comm.cpp includes nccl.h and the CUDA runtime, so this header stays
// free of both: streams are passed as void* (cudaStream_t).
//
// Note [device streams]
// LibTorch computes on its current stream (`compute` below). A device
// communicator issues its NCCL operations on a stream of its own, so they
// overlap computation, and the two are ordered by CUDA events only where data
// passes between them: before an operation reads or writes a tensor, the
// communicator's stream waits for what `compute` had queued when the
// operation was issued (at groupStart() for a group of messages); before
// computation reads a result, the compute stream waits for the operation
// (Request::wait, and groupEnd() after received messages). A buffer the
// communicator reads or writes must stay alive until the operation is done:
// a sent payload's owner is kept until its send has finished (checked at
// later message calls, all at waitSends()), and a collective's buffer by its
// caller until the request's wait(). The caching allocator then never hands
// the memory to another tensor while the communicator's stream still uses
// it, because every free happens after the compute stream waited for that
// use.
#pragma once

#include <memory>
#include <string>

#include "executor/comm/comm.h"
#include "executor/comm/device_api.h"

namespace rannc::comm {

/// True when this build has the NCCL implementation.
bool ncclCompiled();
/// The NCCL library's version ("2.30.7"), or "not compiled".
std::string ncclVersion();
/// Number of CUDA devices visible to this process (0 without CUDA or GPUs).
int visibleCudaDevices();

/// A communicator over the ranks of `host` (which it takes; collective over
/// them) that also takes memory of CUDA device `gpu` written on the compute
/// stream `stream` (Note [device streams]). With `nccl`, device messages and
/// collectives go over NCCL; without (ranks that share a GPU, which NCCL
/// refuses), device collectives are staged through host memory and `host`,
/// finished when a request's wait() returns, and device messages are an
/// error. Host memory always goes to `host`. Throws std::runtime_error when
/// NCCL is asked for but missing or `gpu` is not visible.
std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator> host, int gpu, void *stream,
                                                       bool nccl);

/// Where `group` takes a tensor's memory to be: a GPU tensor's is Device; a
/// device communicator over the rehearsal's stand-in takes CPU tensors as
/// Device too (rehearsal.h), so they travel as a GPU's would.
Memory tensorMemory(const Communicator &group, bool on_gpu);

/// The CUDA runtime and NCCL driving CUDA device `gpu`, for the overload
/// below. Throws std::runtime_error without NCCL or when `gpu` is not visible.
std::shared_ptr<DeviceApi> cudaDevice(int gpu);

/// The same over the device calls of `api` (Note [NCCL-facing interface]):
/// CUDA's, or the rehearsal's (rehearsal.h).
std::unique_ptr<Communicator> createDeviceCommunicator(std::unique_ptr<Communicator> host,
                                                       std::shared_ptr<DeviceApi> api, void *stream, bool nccl);

} // namespace rannc::comm
