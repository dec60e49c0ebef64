// Ends its job through the NCCL communicator's watchdog: an all-reduce queued behind a kernel
// that spins far longer than the 1 s timeout cannot finish in time. The gpu_nccl_timeout test
// expects the message naming the rank, the collective and DDP_NCCL_TIMEOUT_SECONDS.
#include "comm/nccl/nccl_communicator.h"
#include "runtime/runtime_internals.h"
#include <ddp/process_group.h>
#include <ddp/runtime.h>

#include <ATen/cuda/Sleep.h>
#include <torch/cuda.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <iostream>

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  if (!runtime.device().is_cuda() || !ddp::nccl_communicator_built()) {
    std::cout << "nccl_timeout_probe: skipped: no CUDA device" << std::endl;
    return 0;
  }
  return ddp::run_or_abort(runtime, [&] {
    ddp::NcclOptions options;
    options.timeout = std::chrono::seconds(1);
    options.on_fatal_error = [&](const std::string& message) { runtime.abort(message); };
    ddp::NcclCommunicator comm(ddp::detail::RuntimeInternals::comm(runtime), runtime.rank(),
                               runtime.world_size(), runtime.device(), options);
    torch::Tensor t = torch::ones({1}, torch::TensorOptions().device(runtime.device()));
    at::cuda::sleep(int64_t{20'000'000'000});  // about 10 s of GPU time
    comm.all_reduce(t);
    torch::cuda::synchronize();  // the watchdog ends the job while the host waits here
  });
}
