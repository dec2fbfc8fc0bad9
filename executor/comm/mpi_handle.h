// The MPI communicator under a host Communicator, for the other MPI-based
// implementation (the rehearsal's stand-in for NCCL, rehearsal.cpp), which
// needs operations the narrow interface leaves out (synchronous sends,
// non-blocking receives). Only files that talk MPI include this.
#pragma once

#include <mpi.h>

#include "executor/comm/comm.h"

namespace rannc::comm {

/// The MPI_Comm of `c`, made by createMpiCommunicator or split off one;
/// throws std::logic_error for any other communicator.
MPI_Comm mpiHandle(Communicator &c);

} // namespace rannc::comm
