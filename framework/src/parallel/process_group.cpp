#include <ddp/process_group.h>

#include <ddp/config.h>

#include "comm/mpi_communicator.h"
#include "parallel/backend_options.h"
#include "parallel/group_membership.h"
#include "runtime/launcher.h"
#include "runtime/runtime_internals.h"
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

namespace ddp {

bool nccl_communicator_built() { return DDP_WITH_CUDA && DDP_WITH_NCCL; }

namespace {

// Reads a non-negative integer environment variable into `out`; unset or empty leaves it.
void read_env(const char* name, long max, long& out) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return;
  char* end = nullptr;
  const long number = std::strtol(value, &end, 10);
  if (*end != '\0' || number < 0 || number > max) {
    throw std::invalid_argument(std::string(name) + "='" + value + "': expected an integer from 0 to " +
                                std::to_string(max));
  }
  out = number;
}

// The MPI backend's options: the timeout, the debug mode, Runtime::abort when a watchdog fires,
// and its tuning knobs, for measurements (docs/performance.md):
//   DDP_MPI_SPIN_US       MpiOptions::spin in microseconds (busy-testing before sleeping)
//   DDP_MPI_MAX_SLEEP_US  MpiOptions::max_sleep in microseconds (0: never sleep)
//   DDP_MPI_BLOCKING_KIB  MpiOptions::blocking_bytes in KiB
//   DDP_MPI_MESSAGE_KIB   MpiOptions::max_message_bytes in KiB (0: one call per tensor)
// and where the large all-reduces go over ddp's TCP ring (MpiOptions::sockets):
//   DDP_MPI_SOCKETS       auto | never | always
//   DDP_MPI_SOCKET_KIB    MpiOptions::socket_bytes in KiB
//   DDP_SOCKET_IFNAME     MpiOptions::socket_interfaces (comma-separated interface names)
MpiOptions mpi_options(const Runtime& runtime, std::chrono::seconds timeout) {
  MpiOptions options;
  const Environment env = current_environment();
  options.timeout = timeout.count() > 0 ? timeout
                                        : std::chrono::seconds(collective_timeout_seconds(env));
  options.check_collectives = debug_detail(env);
  const Runtime* owner = &runtime;
  options.on_fatal_error = [owner](const std::string& message) { owner->abort(message); };
  long spin_us = options.spin.count();
  read_env("DDP_MPI_SPIN_US", 1000000, spin_us);
  options.spin = std::chrono::microseconds(spin_us);
  long sleep_us = options.max_sleep.count();
  read_env("DDP_MPI_MAX_SLEEP_US", 1000000, sleep_us);
  options.max_sleep = std::chrono::microseconds(sleep_us);
  long blocking_kib = static_cast<long>(options.blocking_bytes >> 10);
  read_env("DDP_MPI_BLOCKING_KIB", 1L << 30, blocking_kib);
  options.blocking_bytes = static_cast<std::size_t>(blocking_kib) << 10;
  long message_kib = static_cast<long>(options.max_message_bytes >> 10);
  read_env("DDP_MPI_MESSAGE_KIB", 1L << 30, message_kib);
  options.max_message_bytes = static_cast<std::size_t>(message_kib) << 10;
  if (const char* sockets = std::getenv("DDP_MPI_SOCKETS"); sockets != nullptr && *sockets != '\0') {
    options.sockets = parse_sockets(sockets, "DDP_MPI_SOCKETS");
  }
  long socket_kib = static_cast<long>(options.socket_bytes >> 10);
  read_env("DDP_MPI_SOCKET_KIB", 1L << 30, socket_kib);
  options.socket_bytes = static_cast<std::size_t>(socket_kib) << 10;
  if (const char* names = std::getenv("DDP_SOCKET_IFNAME")) options.socket_interfaces = names;
  return options;
}

}  // namespace

MpiOptions mpi_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout) {
  return mpi_options(runtime, timeout);
}

#if DDP_WITH_CUDA && DDP_WITH_NCCL
NcclOptions nccl_options_from_environment(const Runtime& runtime, std::chrono::seconds timeout) {
  NcclOptions options;
  options.timeout = timeout.count() > 0
                        ? timeout
                        : std::chrono::seconds(nccl_timeout_seconds(current_environment()));
  const Runtime* owner = &runtime;
  options.on_fatal_error = [owner](const std::string& message) { owner->abort(message); };
  return options;
}
#endif

namespace {

// A process that trains one replica: its communicators are built from the Runtime.
class ProcessMembership final : public detail::GroupMembership {
 public:
  ProcessMembership(Runtime& runtime, ProcessGroupOptions options)
      : runtime_(runtime), options_(options) {}
  int replica() const override { return 0; }
  int replicas_per_process() const override { return 1; }
  std::unique_ptr<Communicator> new_cpu_communicator() override {
    return std::make_unique<MpiCommunicator>(detail::RuntimeInternals::comm(runtime_),
                                             mpi_options(runtime_, options_.timeout));
  }
  std::shared_ptr<Communicator> gpu_communicator() override {
#if DDP_WITH_CUDA && DDP_WITH_NCCL
    return std::make_shared<NcclCommunicator>(
        detail::RuntimeInternals::comm(runtime_), runtime_.rank(), runtime_.world_size(),
        runtime_.device(), nccl_options_from_environment(runtime_, options_.timeout));
#else
    return nullptr;  // not reached: ProcessGroup::gpu() checks has_gpu() first
#endif
  }
  std::string describe() const override { return ""; }

 private:
  Runtime& runtime_;
  ProcessGroupOptions options_;
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
  membership_ = std::make_unique<ProcessMembership>(runtime, options);
  cpu_ = membership_->new_cpu_communicator();
}

ProcessGroup::ProcessGroup(Runtime& runtime, std::unique_ptr<detail::GroupMembership> membership)
    : runtime_(runtime), membership_(std::move(membership)) {
  cpu_ = membership_->new_cpu_communicator();
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
  if (!device.is_cuda()) return new_cpu_communicator();
  const torch::Device mine = this->device();
  if (mine.is_cuda() && device.has_index() && device.index() != mine.index()) {
    throw std::invalid_argument("ProcessGroup::for_device: rank " +
                                std::to_string(rank()) + " computes on " + mine.str() +
                                ", not " + device.str());
  }
  gpu();
  return gpu_;
}

std::unique_ptr<Communicator> ProcessGroup::new_cpu_communicator() {
  return membership_->new_cpu_communicator();
}

}  // namespace ddp
