#include "runtime/launcher.h"

#include <torch/types.h>

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>
#include <stdexcept>

namespace ddp {

namespace {

std::string get(const Environment& env, const std::string& key) {
  const auto it = env.find(key);
  return it == env.end() ? std::string() : it->second;
}

bool has(const Environment& env, const std::string& key) { return env.count(key) > 0; }

// A non-negative integer, or -1 when the variable is absent or not a number.
int get_int(const Environment& env, const std::string& key) {
  const std::string value = get(env, key);
  if (value.empty() || value.size() > 9) return -1;
  for (char c : value) {
    if (!std::isdigit(static_cast<unsigned char>(c))) return -1;
  }
  return std::stoi(value);
}

// Entries of a comma-separated list ("0,1,3" -> 3); "" and "NoDevFiles" (what Slurm and
// HTCondor set when a job has no GPUs) count as none.
int count_list(const std::string& list) {
  if (list.empty() || list == "NoDevFiles") return 0;
  return static_cast<int>(std::count(list.begin(), list.end(), ',')) + 1;
}

// Slurm's compressed per-node counts, "2(x3),1" -> {2, 2, 2, 1}; empty when malformed.
std::vector<int> expand_slurm_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    int count = 0, repeat = 1;
    char close = 0;
    std::stringstream parse(item);
    if (!(parse >> count)) return {};
    if (parse.peek() == '(') {
      parse.ignore(2);  // "(x"
      if (!(parse >> repeat >> close) || close != ')') return {};
    }
    counts.insert(counts.end(), repeat, count);
  }
  return counts;
}

std::string plural(int n, const std::string& word) {
  if (n == 1) return "1 " + word;
  return std::to_string(n) + " " + word + (word.back() == 's' ? "es" : "s");
}

}  // namespace

LaunchInfo detect_launch(const Environment& env) {
  LaunchInfo info;
  info.slurm_job = get(env, "SLURM_JOB_ID");
  info.slurm_step = has(env, "SLURM_STEP_ID");
  info.slurm_node = get(env, "SLURMD_NODENAME");
  info.torch_rank = get_int(env, "RANK");
  info.torch_world_size = get_int(env, "WORLD_SIZE");
  // ", in Slurm job 12" for launchers inside a job; srun's own description says ", job 12".
  const std::string in_job = info.slurm_job.empty() ? "" : ", in Slurm job " + info.slurm_job;

  // Order matters: mpirun inside a Slurm job starts its daemons with srun, so its ranks carry
  // Slurm's step variables too; OMPI_COMM_WORLD_SIZE is what only mpirun sets.
  if (has(env, "OMPI_COMM_WORLD_SIZE")) {
    info.launcher = Launcher::OpenMpi;
    info.description = "Open MPI mpirun" + in_job;
    info.world_size = get_int(env, "OMPI_COMM_WORLD_SIZE");
    info.rank = get_int(env, "OMPI_COMM_WORLD_RANK");
    info.local_rank = get_int(env, "OMPI_COMM_WORLD_LOCAL_RANK");
    info.local_size = get_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE");
    return info;
  }
  if (has(env, "MPI_LOCALNRANKS") || has(env, "HYDRA_CONTROL_FD")) {
    info.launcher = Launcher::Hydra;
    info.description = "MPICH mpiexec (Hydra)" + in_job;
    info.world_size = get_int(env, "PMI_SIZE");
    info.rank = get_int(env, "PMI_RANK");
    info.local_rank = get_int(env, "MPI_LOCALRANKID");
    info.local_size = get_int(env, "MPI_LOCALNRANKS");
    return info;
  }
  if (info.slurm_step) {
    info.launcher = Launcher::Slurm;
    // srun names its MPI plugin in SLURM_MPI_TYPE ("pmix", "pmix_v4", "pmi2"); with --mpi=none
    // it sets nothing, so the PMI variables themselves decide.
    const std::string type = get(env, "SLURM_MPI_TYPE");
    if (type.rfind("pmix", 0) == 0 || (type.empty() && has(env, "PMIX_RANK"))) {
      info.slurm_mpi = "pmix";
    } else if (type == "pmi2" || (type.empty() && has(env, "PMI_FD"))) {
      info.slurm_mpi = "pmi2";
    } else {
      info.slurm_mpi = "none";
    }
    const std::map<std::string, std::string> names = {
        {"pmix", "Slurm srun (PMIx)"},
        {"pmi2", "Slurm srun (PMI-2)"},
        {"none", "Slurm srun without PMI (--mpi=none)"}};
    info.description =
        names.at(info.slurm_mpi) + (info.slurm_job.empty() ? "" : ", job " + info.slurm_job);
    info.world_size = get_int(env, "SLURM_STEP_NUM_TASKS");
    if (info.world_size < 0) info.world_size = get_int(env, "SLURM_NTASKS");
    info.slurm_ntasks = info.world_size;
    info.rank = get_int(env, "SLURM_PROCID");
    info.local_rank = get_int(env, "SLURM_LOCALID");
    info.node_index = get_int(env, "SLURM_NODEID");
    std::string per_node = get(env, "SLURM_STEP_TASKS_PER_NODE");
    if (per_node.empty()) per_node = get(env, "SLURM_TASKS_PER_NODE");
    const std::vector<int> counts = expand_slurm_counts(per_node);
    if (info.node_index >= 0 && info.node_index < static_cast<int>(counts.size())) {
      info.local_size = counts[info.node_index];
    }
    return info;
  }
  if (has(env, "PMIX_RANK")) {
    info.launcher = Launcher::Pmix;
    info.description = "PMIx launcher (namespace " + get(env, "PMIX_NAMESPACE") + ")" + in_job;
    info.rank = get_int(env, "PMIX_RANK");
    return info;
  }
  info.launcher = Launcher::Singleton;
  info.world_size = 1;
  if (info.slurm_job.empty()) {
    info.description = "singleton (no launcher)";
  } else {
    info.description = "singleton in Slurm job " + info.slurm_job + " (outside srun)";
    info.slurm_ntasks = get_int(env, "SLURM_NTASKS");
  }
  return info;
}

std::string launch_error_before_mpi_init(const LaunchInfo& launch, bool open_mpi) {
  if (!open_mpi || launch.launcher != Launcher::Slurm || launch.slurm_mpi != "none") return "";
  return "srun started this step (" + plural(launch.world_size, "task") +
         ") without PMIx (--mpi=none, or the site's default MpiDefault=none), and Open MPI "
         "cannot start without it: MPI_Init would stop with \"OMPI was not built with SLURM's "
         "PMI support\". Start the step with `srun --mpi=pmix ...` (or export "
         "SLURM_MPI_TYPE=pmix; `srun --mpi=list` shows what this site offers). If your Open MPI "
         "does work with this srun, set DDP_SKIP_LAUNCH_CHECKS=1";
}

std::string launch_error(const LaunchInfo& launch, int mpi_world_size) {
  if (mpi_world_size != 1) return "";
  if (launch.world_size > 1) {
    const std::string started =
        "the launcher (" + launch.description + ") started " +
        plural(launch.world_size, "process") +
        " but MPI sees a world of 1 in each, so each would train alone on the whole data set: ";
    if (launch.launcher == Launcher::Slurm) {
      return started + "srun did not connect them (its MPI plugin is '" + launch.slurm_mpi +
             "'). Start the step with `srun --mpi=pmix ...` (or export SLURM_MPI_TYPE=pmix)";
    }
    return started +
           "the program uses another MPI library than this launcher's. Start it with the "
           "mpirun/mpiexec of the MPI it was built with (`ldd <program> | grep libmpi` shows "
           "which)";
  }
  if (launch.launcher == Launcher::Singleton && launch.torch_world_size > 1) {
    const int n = launch.torch_world_size;
    return "RANK=" + std::to_string(std::max(launch.torch_rank, 0)) +
           " and WORLD_SIZE=" + std::to_string(n) +
           " are set (torchrun's variables), but no MPI launcher started this process, so it "
           "would train alone: ddp's ranks are MPI processes, torchrun cannot start them. Start " +
           std::to_string(n) + " ranks with `mpirun -np " + std::to_string(n) +
           " <program>` or `launch/ddprun -n " + std::to_string(n) +
           " <program>` (or unset RANK and WORLD_SIZE to train in one process)";
  }
  if (launch.launcher == Launcher::Singleton && !launch.slurm_job.empty() &&
      launch.slurm_ntasks > 1) {
    return "Slurm job " + launch.slurm_job + " has " + plural(launch.slurm_ntasks, "task") +
           " but this program runs once, outside srun (in the batch script itself), so one "
           "process would train alone. Start it with `srun --mpi=pmix <program>` in the script";
  }
  return "";
}

int gpus_on_node(const Environment& env) {
  const int slurm = get_int(env, "SLURM_GPUS_ON_NODE");
  if (slurm >= 0) return slurm;
  for (const char* key : {"SLURM_STEP_GPUS", "SLURM_JOB_GPUS", "CUDA_VISIBLE_DEVICES"}) {
    if (has(env, key)) return count_list(get(env, key));
  }
  return -1;
}

int gpus_to_pair(const Environment& env, int visible, int local_size, bool own_gpu) {
  if (own_gpu) return local_size;
  if (visible > 0) return visible;
  return gpus_on_node(env);
}

std::string gpu_rank_mismatch(int gpus, int ranks_on_node, const std::string& node,
                              bool cuda_usable) {
  if (gpus <= 0 || gpus == ranks_on_node) return "";
  std::string message = "node " + node + " has " + plural(gpus, "GPU") + " but " +
                        plural(ranks_on_node, "rank") + ", and ddp runs one rank per GPU: ";
  if (ranks_on_node < gpus) {
    message += "each rank uses one GPU, so " + plural(gpus - ranks_on_node, "GPU") +
               (gpus - ranks_on_node == 1 ? " sits" : " sit") + " idle. To use all " +
               std::to_string(gpus) + ", start one task per GPU";
  } else {
    message += "ranks would share GPUs. Start one task per GPU";
  }
  message += ": `srun --ntasks-per-node=" + std::to_string(gpus) +
             "` (Slurm starts one task per node unless told), `mpirun -np <GPUs of the job> "
             "--npernode " +
             std::to_string(gpus) + "` or `ddprun -H host:" + std::to_string(gpus) +
             ",...`; or request as many GPUs as ranks per node";
  if (!cuda_usable) message += " (no CUDA device is usable here: the ranks train on the CPU)";
  return message;
}

ThreadChoice choose_threads(const Environment& env, int cpus_in_mask, int ranks_sharing_mask) {
  ThreadChoice choice;
  // OMP_NUM_THREADS may be a list for nested levels ("4,2"); its first entry is ours.
  const std::string omp = get(env, "OMP_NUM_THREADS");
  const int user = std::atoi(omp.c_str());
  if (user > 0) {
    choice.threads = user;
    choice.from_user = true;
    choice.reason = "OMP_NUM_THREADS=" + omp;
    return choice;
  }
  const int slurm = get_int(env, "SLURM_CPUS_PER_TASK");
  if (slurm > 0 && has(env, "SLURM_JOB_ID")) {
    choice.threads = slurm;
    choice.reason = "SLURM_CPUS_PER_TASK=" + std::to_string(slurm);
    return choice;
  }
  const int cpus = std::max(cpus_in_mask, 1);
  const int sharing = std::max(ranks_sharing_mask, 1);
  choice.threads = std::max(cpus / sharing, 1);
  choice.reason = plural(cpus, "CPU") + (sharing == 1 ? " in this rank's cpuset"
                                                      : " shared by " + plural(sharing, "rank"));
  return choice;
}

bool yield_when_idle(const Environment& env, int local_size, int cpus) {
  const int ranks = std::max(local_size, 1);
  // Unbound ranks share the node's CPUs (ddprun --bind core gives each its own, and then
  // threads + 1 > threads: it yields too).
  const int threads = choose_threads(env, cpus, ranks).threads;
  return ranks * (threads + 1) > std::max(cpus, 1);
}

bool keep_freed_memory(const Environment& env) {
  if (get(env, "GLIBC_TUNABLES").find("glibc.malloc.") != std::string::npos) return false;
  for (const auto& [name, value] : env) {
    if (name.rfind("MALLOC_", 0) == 0) return false;
  }
  return true;
}

std::string describe_job(const LaunchInfo& launch, const std::vector<RankPlace>& ranks,
                         const ThreadChoice& rank0_threads) {
  std::map<int, int> per_node;  // node rank -> ranks on it
  int on_cuda = 0, min_threads = rank0_threads.threads, max_threads = rank0_threads.threads;
  for (const RankPlace& r : ranks) {
    per_node[r.node_rank] = r.local_size;
    on_cuda += r.on_cuda ? 1 : 0;
    min_threads = std::min(min_threads, r.threads);
    max_threads = std::max(max_threads, r.threads);
  }
  const int world = static_cast<int>(ranks.size());
  std::ostringstream out;
  out << "ddp: " << launch.description << ": " << plural(world, "rank") << " on "
      << plural(static_cast<int>(per_node.size()), "node");
  if (per_node.size() > 1) {
    std::string sizes;
    bool uniform = true;
    for (const auto& [node, size] : per_node) {
      uniform = uniform && size == per_node.begin()->second;
      sizes += (sizes.empty() ? "" : "+") + std::to_string(size);
    }
    out << " (" << (uniform ? std::to_string(per_node.begin()->second) + " per node" : sizes)
        << ")";
  }
  if (on_cuda == 0) {
    out << ", device cpu";
  } else if (on_cuda == world) {
    out << ", one GPU per rank";
  } else {
    out << ", " << on_cuda << " on GPUs and " << world - on_cuda << " on the CPU";
  }
  out << ", ";
  if (min_threads == max_threads) {
    out << plural(min_threads, "thread") << " per rank (" << rank0_threads.reason << ")";
  } else {
    out << min_threads << "-" << max_threads
        << " threads per rank (rank 0: " << rank0_threads.reason << ")";
  }
  return out.str();
}

torch::Device select_device(bool use_cuda, int visible_cuda_devices, int local_rank, int local_size,
                            bool own_gpu) {
  if (!use_cuda || visible_cuda_devices <= 0) return torch::Device(torch::kCPU);
  if (own_gpu) return torch::Device(torch::kCUDA, 0);
  const std::string gpus = std::to_string(visible_cuda_devices);
  if (local_size > visible_cuda_devices) {
    throw std::runtime_error(
        std::to_string(local_size) + " ranks on this node but only " + gpus +
        " visible CUDA device(s), and NCCL cannot run two ranks on one GPU: start at most " + gpus +
        " rank(s) per node (`srun --ntasks-per-node=" + gpus + "`, `mpirun --npernode " + gpus +
        "`), give each rank a GPU of its own (`srun --gpus-per-task=1`), or "
        "set RuntimeOptions::use_cuda to false to train on the CPU");
  }
  return torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
}

bool each_rank_sees_its_own_gpu(const std::vector<std::string>& gpu_ids) {
  if (gpu_ids.empty()) return false;
  std::vector<std::string> sorted = gpu_ids;
  std::sort(sorted.begin(), sorted.end());
  return !sorted.front().empty() &&
         std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end();
}

}  // namespace ddp
