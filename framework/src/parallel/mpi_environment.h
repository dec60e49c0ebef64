#pragma once
// The MPI backend's options as the environment sets them (DDP_MPI_POLL_US, DDP_MPI_MESSAGE_KIB;
// process_group.cpp), for every MPI communicator the parallel layer creates: ProcessGroup's and
// the replica hub's (replicas.cpp).

#include <ddp/comm/mpi_communicator.h>

namespace ddp {

MpiOptions mpi_options_from_environment();

}  // namespace ddp
