#include <ddp/process_group.h>

#include <ddp/config.h>

#include "parallel/backend_options.h"
#include "parallel/world_error_handler.h"
#include "runtime/phase_watchdog.h"
#include "runtime/runtime_internals.h"
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl/nccl_communicator.h"
#endif

#include <chrono>
#include <stdexcept>
#include <string>

namespace ddp {

bool nccl_communicator_built() { return DDP_WITH_CUDA && DDP_WITH_NCCL; }

ProcessGroup::ProcessGroup(Runtime& runtime, ProcessGroupOptions options)
    : runtime_(runtime), options_(options), checks_(std::make_shared<detail::GroupChecks>()) {
  if (options.timeout.count() < 0) {
    throw std::invalid_argument(
        "ProcessGroupOptions::timeout must be >= 0 seconds (0: "
        "DDP_TIMEOUT_SECONDS, else 600)");
  }
  // The phases outside collectives (WatchedPhase) wait as long as a collective may.
  set_phase_timeout(collective_timeout(options.timeout));
  detail::install_world_error_handler();  // before any collective of the group
  cpu_ = new_cpu_communicator("ProcessGroup::cpu()");
}

ProcessGroup::~ProcessGroup() = default;

bool ProcessGroup::has_gpu() const { return nccl_communicator_built() && device().is_cuda(); }

Communicator& ProcessGroup::gpu() {
  if (gpu_) return *gpu_;
  if (!has_gpu()) {
    throw std::runtime_error(
        "ProcessGroup::gpu: rank " + std::to_string(runtime_.rank()) +
        " has no NCCL communicator: " +
        (device().is_cuda()
             ? "this build of ddp has none (it needs a CUDA LibTorch and NCCL >= 2.10 when it is "
               "configured; see docs/gpu.md)"
             : "it computes on the CPU (RuntimeOptions::use_cuda is false, or no GPU is "
               "visible); CPU tensors go through cpu()"));
  }
#if DDP_WITH_CUDA && DDP_WITH_NCCL
  const NcclOptions options = nccl_options_from_environment(runtime_, options_.timeout);
  const auto phase =
      detail::setup_phase("creating the NCCL communicator (ncclCommInitRank)", kSetupWhy);
  gpu_ =
      std::make_shared<NcclCommunicator>(detail::RuntimeInternals::comm(runtime_), runtime_.rank(),
                                         runtime_.world_size(), runtime_.device(), options);
#endif
  return *gpu_;
}

std::shared_ptr<Communicator> ProcessGroup::for_device(torch::Device device) {
  if (!device.is_cuda()) return new_cpu_communicator("made by ProcessGroup::for_device(cpu)");
  const torch::Device mine = this->device();
  if (mine.is_cuda() && device.has_index() && device.index() != mine.index()) {
    throw std::invalid_argument("ProcessGroup::for_device: rank " + std::to_string(rank()) +
                                " computes on " + mine.str() + ", not " + device.str());
  }
  gpu();
  return gpu_;
}

std::unique_ptr<Communicator> ProcessGroup::new_cpu_communicator(const std::string& name) {
  // One Inquiry (and debug-mode check) for all of them, made with the first.
  return make_cpu_communicator(
      runtime_, options_, *checks_,
      name.empty() ? "made by ProcessGroup::new_cpu_communicator()" : name);
}

}  // namespace ddp
