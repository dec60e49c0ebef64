#include <ddp/nccl_bootstrap.h>

#include "mpi_check.h"
#include "nccl_check.h"

namespace ddp {

ncclUniqueId broadcast_nccl_unique_id(const Runtime& runtime, int root) {
  ncclUniqueId id{};
  if (runtime.rank() == root) DDP_NCCL_CHECK(ncclGetUniqueId(&id), runtime.rank());
  // The id is an opaque byte array: broadcast its bytes, sizeof(id) elements of MPI_BYTE.
  DDP_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof id), MPI_BYTE, root, runtime.comm()));
  return id;
}

}  // namespace ddp
