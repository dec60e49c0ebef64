#pragma once
// How this process was started (Open MPI's mpirun, Slurm's srun, MPICH's mpiexec, or alone),
// read from the launcher's environment variables, and the checks that turn the classic launch
// mistakes into messages that say how to fix them. All pure functions of an Environment, so every
// launcher can be unit-tested on any machine; ddp::Runtime calls them at start-up.

#include "util/environment.h"

#include <torch/types.h>

#include <string>
#include <vector>

namespace ddp {

enum class Launcher {
  Singleton,  // no launcher: one process, world size 1
  OpenMpi,    // Open MPI's mpirun / mpiexec (also inside a Slurm job)
  Slurm,      // srun started the processes directly (a job step)
  Hydra,      // MPICH's mpiexec (Hydra)
  Pmix,       // another PMIx launcher (prterun, ...)
};

struct LaunchInfo {
  Launcher launcher = Launcher::Singleton;
  // For the banner: "Open MPI mpirun", "Slurm srun (PMIx), job 12", "singleton (no launcher)".
  std::string description;
  // What the launcher says about this process; -1 where it says nothing.
  int world_size = -1;
  int rank = -1;
  int local_rank = -1;
  int local_size = -1;
  int node_index = -1;  // SLURM_NODEID
  // Slurm: job id ("" outside a job), whether this is inside an srun step, the step's MPI
  // plugin as seen from the environment ("pmix", "pmi2", "none"), the node's name, CPUs per task.
  std::string slurm_job;
  bool slurm_step = false;
  std::string slurm_mpi;
  std::string slurm_node;
  int slurm_ntasks = -1;  // tasks of the step (srun) or of the job (batch script)
  // torchrun's variables (RANK, WORLD_SIZE), -1 when absent.
  int torch_rank = -1;
  int torch_world_size = -1;
};

LaunchInfo detect_launch(const Environment& env);

// The mistake that would make MPI_Init itself fail with a misleading message, or "" when none:
// srun starting several tasks without PMIx ("--mpi=none") of an Open MPI program, which then
// dies in MPI_Init with "OMPI was not built with SLURM's PMI support". Only Open MPI needs PMIx
// here (an MPICH built on Slurm's PMI-1 library works with --mpi=none), hence `open_mpi`.
std::string launch_error_before_mpi_init(const LaunchInfo& launch, bool open_mpi);

// The mistakes MPI's world size reveals, as an error with the fix, or "" when none: the launcher
// started N > 1 processes but each sees an MPI world of 1 (srun without PMIx; a launcher from
// another MPI implementation); torchrun's RANK/WORLD_SIZE without an MPI launcher; a Slurm
// batch script running the program itself, without srun, in a job of several tasks. Each
// process would train alone on the whole data set.
std::string launch_error(const LaunchInfo& launch, int mpi_world_size);

// GPUs the launcher gave this node, from SLURM_GPUS_ON_NODE, else the entries of SLURM_STEP_GPUS
// or CUDA_VISIBLE_DEVICES; -1 when none of them is set.
int gpus_on_node(const Environment& env);

// The GPUs of a node to pair with its ranks in gpu_rank_mismatch(): one per rank with `own_gpu`;
// else the CUDA devices this rank sees (`visible`); else, when CUDA sees none, what the launcher
// says the node has (gpus_on_node, -1 if nothing).
int gpus_to_pair(const Environment& env, int visible, int local_size, bool own_gpu);

// Rank 0's one-line notice, with the fix, when a node's GPUs and ranks do not pair up one to one
// (each rank uses one GPU; the notice says how to use all), or "" when they do or there are no
// GPUs. `node` names the node; without `cuda_usable` the notice says the ranks run on the CPU.
std::string gpu_rank_mismatch(int gpus, int ranks_on_node, const std::string& node,
                              bool cuda_usable);

// LibTorch's intra-op threads per rank and why: OMP_NUM_THREADS when the user set it (then
// LibTorch already uses it), else SLURM_CPUS_PER_TASK inside a Slurm job, else the CPUs in this
// rank's affinity mask (its cpuset) divided by the ranks on the node that share that mask: all
// of them when the launcher did not bind, just this one when it bound each rank to its cores.
struct ThreadChoice {
  int threads = 1;
  bool from_user = false;  // OMP_NUM_THREADS: leave LibTorch's setting alone
  std::string reason;      // "OMP_NUM_THREADS=1", "2 CPUs shared by 2 ranks", ...
};
ThreadChoice choose_threads(const Environment& env, int cpus_in_mask, int ranks_sharing_mask);

// Whether Open MPI should yield the core while a collective waits (mpi_yield_when_idle), decided
// before MPI_Init: yes when the node's busy threads, local_size ranks x (intra-op threads + the
// MPI communicators' worker threads), exceed the CPUs, so spinning would take a core from training;
// no when there is a core to spare, because a yielding worker thread is scheduled late and the
// collective slows. `local_size` < 1 counts as 1.
bool yield_when_idle(const Environment& env, int local_size, int cpus);

// Whether the Runtime keeps freed host memory in the process for reuse (glibc malloc: blocks
// under 32 MiB from the heap, never trimmed), so that a step's tensors, allocated and freed alike
// every step, do not fault their pages in again each step. No when the user tunes malloc
// (GLIBC_TUNABLES naming a glibc.malloc setting, or any MALLOC_* variable): theirs stands.
bool keep_freed_memory(const Environment& env);

// One rank's place, gathered on rank 0 for the banner.
struct RankPlace {
  int node_rank = 0;
  int local_size = 1;
  bool on_cuda = false;
  int threads = 1;  // LibTorch's intra-op threads
};

// Rank 0's start-up banner, e.g. "ddp: Slurm srun (PMIx), job 12: 4 ranks on 2 nodes
// (2 per node), device cpu, 1 thread per rank (SLURM_CPUS_PER_TASK=1)".
std::string describe_job(const LaunchInfo& launch, const std::vector<RankPlace>& ranks,
                         const ThreadChoice& rank0_threads);

// The device a rank computes on: the CPU when `use_cuda` is false or no CUDA device is visible;
// cuda:0 when `own_gpu` (every rank of the node sees exactly one GPU, no two the same); else
// cuda:<local_rank>. More ranks on the node than visible GPUs: std::runtime_error naming the
// counts and the fixes (NCCL cannot run two ranks on one GPU). Fewer is gpu_rank_mismatch()'s.
torch::Device select_device(bool use_cuda, int visible_cuda_devices, int local_rank, int local_size,
                            bool own_gpu = false);

// Whether every rank of a node has a GPU of its own, from each rank's id (UUID) of the one GPU
// it sees, "" when it sees none or several: all ids present and no two equal.
bool each_rank_sees_its_own_gpu(const std::vector<std::string>& gpu_ids);

}  // namespace ddp
