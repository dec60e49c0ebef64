#pragma once
// Which backend DistributedDataParallel uses (internal; tests/core/test_placement.cpp covers it).

#include <ddp/distributed_data_parallel.h>

#include <c10/core/Device.h>

namespace ddp {

// The backend for parameters on `params_device`, with Backend::Auto resolved: NCCL when they are
// on `rank_device` (Runtime::device()), a CUDA device, and `nccl_built`
// (nccl_communicator_built()); MPI otherwise. Throws std::invalid_argument naming
// DDPOptions::backend when `requested` is Nccl and that cannot work. Pure.
Backend resolve_backend(Backend requested, c10::Device params_device, c10::Device rank_device,
                        bool nccl_built);

}  // namespace ddp
