#pragma once
// The backends' options as the group's options and the environment set them, for every
// communicator the parallel layer creates (ProcessGroup's and the replica set's): the timeout
// (ProcessGroupOptions::timeout, else DDP_TIMEOUT_SECONDS, else 600 s), the debug mode and the
// MPI tuning variables (process_group.cpp), and Runtime::abort for a watchdog that fires.

#include "comm/mpi_communicator.h"
#include <ddp/config.h>
#include <ddp/runtime.h>
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif

#include <chrono>

namespace ddp {

// timeout 0: DDP_TIMEOUT_SECONDS, else 600 s.
MpiOptions mpi_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);

#if DDP_WITH_CUDA && DDP_WITH_NCCL
// timeout 0: DDP_NCCL_TIMEOUT_SECONDS, else DDP_TIMEOUT_SECONDS, else 600 s.
NcclOptions nccl_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout);
#endif

}  // namespace ddp
