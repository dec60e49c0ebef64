#pragma once
// NCCL start-up over MPI (built only when NCCL is found): rank 0 creates the unique id that
// names the NCCL clique and MPI broadcasts it, so no separate rendezvous service is needed.

#include <mpi.h>
#include <nccl.h>

namespace ddp {

// Collective over all ranks of `comm` (`rank` is this rank's place in it): returns the same id
// on every rank.
ncclUniqueId broadcast_nccl_unique_id(MPI_Comm comm, int rank, int root = 0);

}  // namespace ddp
