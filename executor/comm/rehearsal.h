// A stand-in for a GPU and NCCL on the CPU, so the GPU path's logic runs
// without a GPU (docs/gpu.md, "Rehearsal on the CPU").
//
// Note [rehearsal]
// The stand-in implements DeviceApi (Note [NCCL-facing interface]) over MPI,
// keeping the rules of CUDA and NCCL that the GPU path's logic can break:
// - Streams are queues: work queued on a stream runs in order, on a progress
//   thread of its own (the GPU's part), whatever the host is doing. An event
//   records a point in a stream's queue; a stream that waits for an event
//   runs nothing queued after the wait until the work before that point is
//   done. The compute stream (the null stream) is the host itself: LibTorch
//   computes CPU tensors as it is called, so the compute stream waiting for
//   an event is the host waiting for it.
// - Work reads its inputs when it runs and writes its outputs when it
//   completes, from and into copies: a missing wait for a computation, or a
//   tensor read before its receive is waited for, changes the numbers, as it
//   would on a GPU, and the equivalence tests see it.
// - A NCCL communicator is an MPI communicator of its own. Each collective
//   first compares what every rank issued (which collective, how many
//   floats, which reduction, its number on the communicator): ranks that
//   disagree fail at once with a message naming the communicator, the call,
//   and what each rank issued, where NCCL would hang or mix data.
// - ncclSend completes only when the peer's matching ncclRecv runs (an MPI
//   synchronous send), as NCCL blocks; the operations of one ncclGroupStart/
//   End are one launch that runs together, and ungrouped ones each run
//   alone, in stream order. So a send and a receive that need each other but
//   are not grouped hang here as in NCCL.
// - A hang is found by time: a host waiting on the stand-in for `stall_s`
//   asks every rank what it is doing (their progress threads answer even when
//   their hosts are busy), and fails with all the answers.
// It cannot show the libraries themselves: real kernels, NCCL's algorithms
// and transports, streams really running concurrently with compute.
#pragma once

#include <memory>

#include "executor/comm/device_api.h"

namespace rannc::comm {

/// How the stand-in reports hangs, and a test hook that breaks the rules.
struct RehearsalOptions {
  double stall_s = 60; ///< a host waiting this long on the stand-in reports every rank's state and fails
  int swap_rank = -1;  ///< test hook: this rank (of the world) issues two collectives swapped,
  int swap_call = 1;   ///< the swap_call-th and next collective of the first communicator that has them
};

/// A stand-in for one device per rank of `world` (collective over it): its
/// communicators take CPU tensors as device memory. Needs MPI with
/// MPI_THREAD_MULTIPLE (createMpiCommunicator asks for it).
std::shared_ptr<DeviceApi> createRehearsalDevice(Communicator &world, const RehearsalOptions &options);

} // namespace rannc::comm
