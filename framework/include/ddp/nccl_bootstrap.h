#pragma once
// NCCL start-up over MPI (built only when NCCL is found): rank 0 creates the unique id that
// names the NCCL clique and MPI broadcasts it, so no separate rendezvous service is needed.

#include <ddp/runtime.h>

#include <nccl.h>

namespace ddp {

// Collective over all ranks of `runtime`: returns the same id on every rank.
ncclUniqueId broadcast_nccl_unique_id(const Runtime& runtime, int root = 0);

}  // namespace ddp
