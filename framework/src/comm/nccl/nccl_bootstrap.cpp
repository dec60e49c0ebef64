#include "comm/nccl/nccl_bootstrap.h"

#include "util/mpi_check.h"
#include "util/nccl_check.h"

namespace ddp {

ncclUniqueId broadcast_nccl_unique_id(MPI_Comm comm, int rank, int root) {
  ncclUniqueId id{};
  if (rank == root) DDP_NCCL_CHECK(ncclGetUniqueId(&id), rank);
  // The id is an opaque byte array: broadcast its bytes, sizeof(id) elements of MPI_BYTE.
  DDP_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, root, comm));
  return id;
}

}  // namespace ddp
