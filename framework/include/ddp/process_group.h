#pragma once
/// \file
/// The job's communicators, built from the Runtime (what PyTorch calls the default process
/// group): cpu() is an MPI communicator over every rank, for CPU tensors; gpu() is the NCCL
/// communicator on the rank's GPU, created on first use so that CPU and MPI-only programs never
/// pay NCCL's start-up. Create one after the Runtime, before anything that communicates:
///   ddp::Runtime runtime(argc, argv);
///   ddp::ProcessGroup group(runtime);
///   ddp::DistributedDataParallel model(group, net);
///
/// The backends know nothing of the Runtime: they get what they need from it here.
///
/// Invariant: destroyed before the Runtime (declare it after), since its communicators need MPI.

#include <ddp/communicator.h>
#include <ddp/runtime.h>

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <string>

namespace ddp {

/// What a ProcessGroup's communicators are made with.
struct ProcessGroupOptions {
  /// How long a collective of any of the group's communicators (MPI and NCCL) may take before
  /// its watchdog ends the job. 0: DDP_TIMEOUT_SECONDS, else 600 s (PyTorch's default); NCCL's
  /// still honours the older DDP_NCCL_TIMEOUT_SECONDS.
  std::chrono::seconds timeout{0};
  /// Whether the CPU communicators' all-reduces go through one leader per host (reduce on each
  /// host, all-reduce among the leaders, broadcast on each host). Auto: when the ranks span
  /// several hosts and some host has several ranks. Equal to the flat all-reduce up to the order
  /// of the additions, and bitwise the same on every rank either way.
  HierarchicalAllReduce hierarchical = HierarchicalAllReduce::Auto;
};

namespace detail {
struct GroupChecks;  ///< parallel/backend_options.h: what the group's MPI communicators share
}

/// The job's communicators (this file's comment says what they are and when they are made).
class ProcessGroup {
 public:
  /// Collective over every rank of `runtime`. Reads the DDP_* environment (timeout, debug mode,
  /// MPI tuning); a bad value is an error naming the variable.
  explicit ProcessGroup(Runtime& runtime, ProcessGroupOptions options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  /// The Runtime it was made from.
  Runtime& runtime() const { return runtime_; }

  /// The Runtime's rank and world size: one process is one rank and one model replica.
  ///@{
  int rank() const { return runtime_.rank(); }
  int size() const { return runtime_.world_size(); }
  ///@}
  /// rank() == 0: the one that prints and writes files.
  bool is_main() const { return rank() == 0; }
  /// The device this rank computes on (Runtime::device).
  torch::Device device() const { return runtime_.device(); }

  /// Collectives over all ranks for CPU tensors (MPI).
  Communicator& cpu() { return *cpu_; }

  /// Whether gpu() can exist: this rank computes on CUDA and nccl_communicator_built().
  bool has_gpu() const;
  /// Collectives over all ranks for CUDA tensors on runtime().device() (NCCL). The first call
  /// creates it and is therefore collective: every rank must make it (DistributedDataParallel
  /// does, when it picks NCCL). Throws std::runtime_error saying why when has_gpu() is false.
  Communicator& gpu();

  /// A communicator for collectives on tensors of `device`, shared with its caller (model layers
  /// that communicate, SyncBatchNorm): gpu() for a CUDA device, a new MPI communicator for the
  /// CPU, so that its traffic cannot be confused with anybody else's. Collective.
  std::shared_ptr<Communicator> for_device(torch::Device device);

  /// A new MPI communicator over all ranks, with a worker thread of its own. Collective. Under
  /// DDP_DEBUG=DETAIL the calls of all the group's MPI communicators are checked as one sequence
  /// (docs/reliability.md), so their order across communicators must be the same on every rank;
  /// `name` names this one in messages ("": "made by ProcessGroup::new_cpu_communicator()").
  std::unique_ptr<Communicator> new_cpu_communicator(const std::string& name = "");

 private:
  Runtime& runtime_;
  ProcessGroupOptions options_;
  std::shared_ptr<detail::GroupChecks> checks_;  ///< one for all its MPI communicators
  std::unique_ptr<Communicator> cpu_;
  std::shared_ptr<Communicator> gpu_;  ///< shared with for_device()'s users
};

/// Whether this build has the NCCL communicator (a CUDA LibTorch and NCCL >= 2.10 when it was
/// configured: DDP_WITH_CUDA and DDP_WITH_NCCL in ddp/config.h).
bool nccl_communicator_built();

}  // namespace ddp
