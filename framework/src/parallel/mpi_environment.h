#pragma once
// The MPI backend's options as the group's options and the environment set them (the timeout,
// DDP_DEBUG, DDP_MPI_*; process_group.cpp), for every MPI communicator the parallel layer
// creates: ProcessGroup's and the replica hub's (replicas.cpp).

#include <ddp/comm/mpi_communicator.h>
#include <ddp/runtime/runtime.h>

#include <chrono>

namespace ddp {

// timeout 0: DDP_TIMEOUT_SECONDS, else 600 s. A watchdog that fires calls runtime.abort().
MpiOptions mpi_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);

}  // namespace ddp
