#pragma once
// The process's place in the job: MPI start-up and shutdown, rank, node and local rank, and the
// device this rank computes on. Create exactly one, first thing in main().
//
// Invariants: the topology never changes after construction; ranks with the same node_rank()
// share memory (MPI_COMM_TYPE_SHARED), local ranks are numbered 0..local_size()-1 in world-rank
// order, and nodes are numbered in the order of their lowest world rank.
//
// Start-up also checks how the job was launched (launcher.h): a launch that cannot work (srun
// without PMIx, torchrun's variables without MPI, ...) ends with a message saying how to fix it,
// rank 0 prints a banner (launcher, nodes, ranks per node, devices, threads) and warns when a
// node's GPUs and ranks do not pair up, and LibTorch's intra-op threads are set to the CPUs
// this rank has unless OMP_NUM_THREADS says otherwise. Set DDP_SKIP_LAUNCH_CHECKS=1 to skip
// the checks.
//
// GPUs (docs/gpu.md): each rank computes on GPU local_rank() among those it sees, or on device 0
// when the launcher gave every rank a GPU of its own (select_device); start-up makes that device
// current, before anything is allocated on it.
//
// The Runtime says where the job runs; it does not communicate tensors. The communicators are
// built from it by ProcessGroup (parallel/process_group.h).

#include <ddp/runtime/launcher.h>

#include <mpi.h>
#include <torch/types.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace ddp {

struct RuntimeOptions {
  // false keeps the rank on the CPU even where CUDA is available (the examples' --no-cuda).
  bool use_cuda = true;
  // false: rank 0 prints no start-up banner (warnings and errors still appear).
  bool print_banner = true;
  // Replicas this process trains, one thread each (parallel/replicas.h): 0 picks the default,
  // the GPUs this process sees per local rank on a GPU (default_replicas_per_process in
  // launcher.h), 1 on the CPU. Must come out the same on every rank.
  int replicas_per_process = 0;
};

class Runtime {
 public:
  // Initialises MPI with MPI_THREAD_MULTIPLE unless the program already did; then it leaves
  // MPI_Finalize to the program too. Collective. If no device fits this rank (more ranks on a
  // node than visible GPUs) the job is aborted with the reason. A CUDA device is made current.
  Runtime(int& argc, char**& argv, RuntimeOptions options = {});
  explicit Runtime(RuntimeOptions options = {});
  // Finalises MPI if it initialised it. If an exception is unwinding through here the job is
  // aborted instead: finalising while other ranks wait in a collective would hang them.
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int local_rank() const { return local_rank_; }
  int local_size() const { return local_size_; }
  int node_rank() const { return node_rank_; }
  int num_nodes() const { return num_nodes_; }
  bool is_main() const { return rank_ == 0; }
  const std::string& hostname() const { return hostname_; }
  // The device of the process's first replica (its only one, unless replicas_per_process() > 1).
  torch::Device device() const { return device_; }
  // Replicas this process trains (RuntimeOptions::replicas_per_process, resolved); the same on
  // every rank, so the job has world_size() * replicas_per_process() replicas.
  int replicas_per_process() const { return replicas_; }
  // The device of replica `replica` (0..replicas_per_process()-1): the CPU, or GPU
  // local_rank() * replicas_per_process() + replica.
  torch::Device replica_device(int replica) const;
  // The intra-op threads of each replica: threads() divided among the replicas unless
  // OMP_NUM_THREADS set them.
  const ThreadChoice& replica_threads() const { return replica_threads_; }
  int mpi_thread_level() const { return thread_level_; }
  // How the job was started, from the environment the launcher left (read before MPI_Init).
  const LaunchInfo& launch() const { return launch_; }
  // The intra-op thread count chosen for this rank and why (set once per process).
  const ThreadChoice& threads() const { return threads_; }

  // "rank 1/4 local 1/2 node 0/2 host n1 device cpu"
  std::string summary() const;

  // The library's own duplicate of MPI_COMM_WORLD, for bootstrap exchanges (communicators
  // are duplicated from it; the NCCL unique id travels over it).
  MPI_Comm comm() const { return comm_; }

  // Prints "ddp: rank R (host): message" to stderr and ends every rank of the job.
  [[noreturn]] void abort(const std::string& message, int exit_code = 1) const;

 private:
  void check_launch_before_mpi_init();
  bool yield_before_init() const;  // from launch_ (read by check_launch_before_mpi_init)
  void init_topology(RuntimeOptions options);
  void set_threads(MPI_Comm node_comm);
  // Every local rank's id of the one GPU it sees ("" if none or several); collective on the node.
  std::vector<std::string> gpu_ids_on_node(MPI_Comm node_comm) const;
  void report_job(const RuntimeOptions& options) const;

  bool owns_mpi_ = false;
  int uncaught_at_construction_ = 0;
  int thread_level_ = 0;
  int rank_ = 0, world_size_ = 1;
  int local_rank_ = 0, local_size_ = 1;
  int node_rank_ = 0, num_nodes_ = 1;
  std::string hostname_;
  torch::Device device_{torch::kCPU};
  LaunchInfo launch_;
  ThreadChoice threads_;
  ThreadChoice replica_threads_;
  int replicas_ = 1;
  int visible_gpus_ = 0;  // CUDA devices this rank sees (0 without CUDA or with use_cuda off)
  bool own_gpu_ = false;  // every rank of the node sees one GPU, its own
  MPI_Comm comm_ = MPI_COMM_NULL;
};

// Runs `body`; an exception escaping it is printed with the rank and host and the whole job is
// aborted, so one failing rank ends the job quickly instead of leaving the others in a
// collective. Returns 0 when `body` returns. Typical main():
//   ddp::Runtime runtime(argc, argv);
//   return ddp::run_or_abort(runtime, [&] { ... });
int run_or_abort(const Runtime& runtime, const std::function<void()>& body);

// The device a rank computes on. Pure, so every environment can be unit-tested:
// - the CPU when `use_cuda` is false (--no-cuda) or no CUDA device is visible;
// - cuda:0 when `own_gpu`: every rank of the node sees exactly one GPU and no two see the same
//   (srun --gpus-per-task=1, or CUDA_VISIBLE_DEVICES set per rank; CUDA numbers it 0);
// - cuda:<local_rank> when the ranks see all the node's GPUs (srun --gpus-per-node, mpirun);
// - std::runtime_error naming the counts and the fixes when the node has more ranks than
//   visible GPUs (NCCL cannot run two ranks on one GPU).
// Fewer ranks than GPUs is not an error: rank 0 warns (gpu_rank_mismatch in launcher.h).
// With `replicas` per rank (RuntimeOptions::replicas_per_process), replica `replica` of the
// rank computes on cuda:<local_rank * replicas + replica>; the node must have local_size *
// replicas GPUs, and a rank that sees one GPU of its own (`own_gpu`) cannot have several.
torch::Device select_device(bool use_cuda, int visible_cuda_devices, int local_rank,
                            int local_size, bool own_gpu = false, int replicas = 1,
                            int replica = 0);

// Whether every rank of a node has a GPU of its own, from each rank's id (UUID) of the one GPU
// it sees, "" when it sees none or several: all ids present and no two equal.
bool each_rank_sees_its_own_gpu(const std::vector<std::string>& gpu_ids);

}  // namespace ddp
