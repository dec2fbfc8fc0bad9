// The MPI job the communicator tests share (tests/executor/comm).
#pragma once

#include <memory>

#include "executor/comm/comm.h"

namespace rannc::comm {

/// The job's world, initialized once per process and finalized at exit:
/// every test shares it.
inline Communicator &world() {
  static std::unique_ptr<Communicator> c = [] {
    int argc = 0;
    char **argv = nullptr;
    return createMpiCommunicator(&argc, &argv);
  }();
  return *c;
}

} // namespace rannc::comm
