#include <ddp/process_group.h>

#include <ddp/config.h>

#include "parallel/backend_options.h"
#include "parallel/group_membership.h"
#include "runtime/phase_watchdog.h"
#include "runtime/runtime_internals.h"
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif

#include <chrono>
#include <stdexcept>
#include <string>

namespace ddp {

bool nccl_communicator_built() { return DDP_WITH_CUDA && DDP_WITH_NCCL; }

namespace {

// A process that trains one replica: its communicators are built from the Runtime.
class ProcessMembership final : public detail::GroupMembership {
 public:
  ProcessMembership(Runtime& runtime, ProcessGroupOptions options)
      : runtime_(runtime), options_(options) {}
  int replica() const override { return 0; }
  int replicas_per_process() const override { return 1; }
  std::unique_ptr<Communicator> new_cpu_communicator(const std::string& name) override {
    // One Inquiry (and debug-mode check) for all of them, made with the first.
    return make_cpu_communicator(runtime_, options_, &shared_, name);
  }
  std::shared_ptr<Communicator> gpu_communicator() override {
#if DDP_WITH_CUDA && DDP_WITH_NCCL
    const NcclOptions options = nccl_options_from_environment(runtime_, options_.timeout);
    const auto phase = detail::setup_phase("creating the NCCL communicator (ncclCommInitRank)",
                                           kSetupWhy);
    return std::make_shared<NcclCommunicator>(
        detail::RuntimeInternals::comm(runtime_), runtime_.rank(), runtime_.world_size(),
        runtime_.device(), options);
#else
    return nullptr;  // not reached: ProcessGroup::gpu() checks has_gpu() first
#endif
  }
  std::string describe() const override { return ""; }

 private:
  Runtime& runtime_;
  ProcessGroupOptions options_;
  GroupChecks shared_;
};

}  // namespace

ProcessGroup::ProcessGroup(Runtime& runtime, ProcessGroupOptions options) : runtime_(runtime) {
  if (options.timeout.count() < 0) {
    throw std::invalid_argument("ProcessGroupOptions::timeout must be >= 0 seconds (0: "
                                "DDP_TIMEOUT_SECONDS, else 600)");
  }
  if (runtime.replicas_per_process() > 1) {
    throw std::logic_error(
        "ProcessGroup: rank " + std::to_string(runtime.rank()) + " is to train " +
        std::to_string(runtime.replicas_per_process()) +
        " replicas (RuntimeOptions::replicas_per_process), but ProcessGroup(runtime) is one: "
        "run the training body with ddp::run_replicas (<ddp/replicas.h>), which gives each "
        "replica thread its group");
  }
  // The phases outside collectives (WatchedPhase) wait as long as a collective may.
  set_phase_timeout(collective_timeout(options.timeout));
  membership_ = std::make_unique<ProcessMembership>(runtime, options);
  cpu_ = membership_->new_cpu_communicator("ProcessGroup::cpu()");
}

ProcessGroup::ProcessGroup(Runtime& runtime, std::unique_ptr<detail::GroupMembership> membership)
    : runtime_(runtime), membership_(std::move(membership)) {
  cpu_ = membership_->new_cpu_communicator("ProcessGroup::cpu()");
}

ProcessGroup::~ProcessGroup() = default;

int ProcessGroup::replica() const { return membership_->replica(); }

int ProcessGroup::replicas_per_process() const { return membership_->replicas_per_process(); }

bool ProcessGroup::has_gpu() const {
  return nccl_communicator_built() && device().is_cuda();
}

Communicator& ProcessGroup::gpu() {
  if (gpu_) return *gpu_;
  if (!has_gpu()) {
    throw std::runtime_error(
        "ProcessGroup::gpu: rank " + std::to_string(runtime_.rank()) + membership_->describe() +
        " has no NCCL communicator: " +
        (device().is_cuda()
             ? "this build of ddp has none (it needs a CUDA LibTorch and NCCL >= 2.10 when it is "
               "configured; see docs/gpu.md)"
             : "it computes on the CPU (RuntimeOptions::use_cuda is false, or no GPU is "
               "visible); CPU tensors go through cpu()"));
  }
  gpu_ = membership_->gpu_communicator();
  return *gpu_;
}

std::shared_ptr<Communicator> ProcessGroup::for_device(torch::Device device) {
  if (!device.is_cuda()) return new_cpu_communicator("made by ProcessGroup::for_device(cpu)");
  const torch::Device mine = this->device();
  if (mine.is_cuda() && device.has_index() && device.index() != mine.index()) {
    throw std::invalid_argument("ProcessGroup::for_device: rank " +
                                std::to_string(rank()) + " computes on " + mine.str() +
                                ", not " + device.str());
  }
  gpu();
  return gpu_;
}

std::unique_ptr<Communicator> ProcessGroup::new_cpu_communicator(const std::string& name) {
  return membership_->new_cpu_communicator(
      name.empty() ? "made by ProcessGroup::new_cpu_communicator()" : name);
}

}  // namespace ddp
