#pragma once
/// \file
/// The process's place in the job: MPI start-up and shutdown, rank, node and local rank, and the
/// device this rank computes on. Create exactly one, first thing in main().
///
/// Invariants: the topology never changes after construction; ranks with the same node_rank()
/// share memory (MPI_COMM_TYPE_SHARED), local ranks are numbered 0..local_size()-1 in world-rank
/// order, and nodes are numbered in the order of their lowest world rank.
///
/// Start-up checks the launch (one that cannot work, e.g. srun without PMIx, ends with a message
/// saying how to fix it; DDP_SKIP_LAUNCH_CHECKS=1 skips this), has rank 0 print a banner, sets
/// LibTorch's intra-op threads to the rank's CPUs unless OMP_NUM_THREADS says otherwise, and keeps
/// freed host memory in the process for the next step's tensors (glibc malloc: blocks under
/// 32 MiB come from the heap, which is never trimmed; docs/performance.md) unless GLIBC_TUNABLES
/// or a MALLOC_* variable tunes malloc.
///
/// GPUs (docs/gpu.md): each rank computes on GPU local_rank() among those it sees, or on device 0
/// when every rank has a GPU of its own, made current before anything is allocated. A node with
/// more ranks than visible GPUs ends the job saying how to launch it; fewer is a notice on rank 0.
///
/// The Runtime does not communicate tensors: ProcessGroup (process_group.h) builds the
/// communicators from it. This header includes no MPI header.

#include <torch/types.h>

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

namespace ddp {

/// How the Runtime places this rank.
struct RuntimeOptions {
  /// false keeps the rank on the CPU even where CUDA is available (the examples' --no-cuda).
  bool use_cuda = true;
  /// false: rank 0 prints no start-up banner (warnings and errors still appear).
  bool print_banner = true;
  /// How long MPI start-up may wait for the other ranks before the phase watchdog ends the job
  /// (WatchedPhase). 0: DDP_STARTUP_TIMEOUT_SECONDS, else 600 s. Must be >= 0.
  std::chrono::seconds startup_timeout{0};
};

namespace detail {
struct RuntimeInternals;  ///< runtime/runtime_internals.h: the bootstrap MPI communicator, ...
}

/// The process's place in the job (this file's comment says what start-up does).
class Runtime {
 public:
  /// Initialises MPI with MPI_THREAD_MULTIPLE unless the program already did; then it leaves
  /// MPI_Finalize to the program too. Collective. If no device fits this rank (more ranks on a
  /// node than visible GPUs) the job is aborted with the reason. A CUDA device is made current.
  /// Throws std::invalid_argument, before MPI_Init, for a negative startup_timeout.
  Runtime(int& argc, char**& argv, RuntimeOptions options = {});
  /// The same for `int main(int argc, const char* argv[])`: MPI_Init gets no arguments (MPI-2
  /// and later need none; Open MPI reads what mpirun passes from the environment), and they are
  /// left as they are.
  Runtime(int argc, const char* const* argv, RuntimeOptions options = {});
  /// The same, without the program's arguments (MPI_Init gets none).
  explicit Runtime(RuntimeOptions options = {});
  /// Finalises MPI if it initialised it. If an exception is unwinding through here the job is
  /// aborted instead: finalising while other ranks wait in a collective would hang them.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }              ///< this process's rank in MPI_COMM_WORLD
  int world_size() const { return world_size_; }  ///< the number of processes
  int local_rank() const { return local_rank_; }  ///< its rank among the processes of its node
  int local_size() const { return local_size_; }  ///< the processes of its node
  int node_rank() const { return node_rank_; }    ///< its node's number
  int num_nodes() const { return num_nodes_; }    ///< the job's nodes
  bool is_main() const { return rank_ == 0; }     ///< rank 0
  const std::string& hostname() const { return hostname_; }  ///< MPI's processor name
  /// The device this rank computes on.
  torch::Device device() const { return device_; }
  /// MPI's thread support level (MPI_THREAD_MULTIPLE, which the communicators need).
  int mpi_thread_level() const { return thread_level_; }

  /// "rank 1/4 local 1/2 node 0/2 host n1 device cpu"
  std::string summary() const;

  /// Prints "ddp: rank R (host): message" to stderr and ends every rank of the job.
  [[noreturn]] void abort(const std::string& message, int exit_code = 1) const;

 private:
  friend struct detail::RuntimeInternals;
  struct Impl;  ///< runtime/runtime_internals.h: MPI communicator, launch and thread choices
  void start(int* argc, char*** argv, RuntimeOptions options);
  void init_topology(RuntimeOptions options);
  void report_job(const RuntimeOptions& options) const;

  std::unique_ptr<Impl> impl_;
  bool owns_mpi_ = false;
  int uncaught_at_construction_ = 0;
  int thread_level_ = 0;
  int rank_ = 0, world_size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  int node_rank_ = 0, num_nodes_ = 1;
  std::string hostname_;
  torch::Device device_{torch::kCPU};
  int visible_gpus_ = 0;  ///< CUDA devices this rank sees (0 without CUDA or with use_cuda off)
  bool own_gpu_ = false;  ///< every rank of the node sees one GPU, its own
};

/// A phase of this rank's life that can block on other ranks or a file system where no collective
/// watchdog runs (MPI start-up, building a communicator, DistributedDataParallel's constructor,
/// loading data, an evaluation, writing a snapshot). Once a phase has made no progress for its
/// timeout, the process's phase watchdog (a thread, started with the first phase) ends the job:
///   ddp: rank 0 (host): watchdog: loading data (...) unfinished after 605 s (limit 600 s:
///   ProcessGroupOptions::timeout, --timeout, DDP_TIMEOUT_SECONDS). Ending the job.
/// then MPI_Abort (before MPI is up: exit status 1, and the launcher ends the others). So a
/// stopped or stuck rank cannot leave the others waiting forever in MPI_Init or MPI_Comm_dup.
///
/// Invariants: phases nest per thread and only each thread's innermost one is watched (when it
/// ends, the enclosing one's clock restarts). A phase fires 5 s after its timeout, so that the
/// watchdog of a collective inside it, which names the missing ranks, reports first.
class WatchedPhase {
 public:
  /// `what` names the phase in the message, e.g. "loading data (train-images-idx3-ubyte)".
  /// `timeout` 0: the phase timeout (set_phase_timeout(), else DDP_TIMEOUT_SECONDS, else 600 s).
  explicit WatchedPhase(const std::string& what,
                        std::chrono::seconds timeout = std::chrono::seconds(0));
  ~WatchedPhase();
  WatchedPhase(const WatchedPhase&) = delete;
  WatchedPhase& operator=(const WatchedPhase&) = delete;
  /// The phase goes on: its timeout counts again from now.
  void progress();

 private:
  uint64_t id_;
};

/// The timeout of the phases that name none (> 0). ProcessGroup's constructor sets it.
void set_phase_timeout(std::chrono::seconds timeout);

/// Runs `body`; an exception escaping it is printed with the rank and host and the whole job is
/// aborted, so one failing rank ends the job quickly instead of leaving the others in a
/// collective. Returns 0 when `body` returns. Typical main():
///   ddp::Runtime runtime(argc, argv);
///   return ddp::run_or_abort(runtime, [&] { ... });
int run_or_abort(const Runtime& runtime, const std::function<void()>& body);

}  // namespace ddp
