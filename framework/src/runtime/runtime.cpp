#include <ddp/runtime.h>

#include <ddp/config.h>

#include "runtime/phase_watchdog.h"
#include "runtime/runtime_internals.h"
#include "util/hash.h"
#include "util/host_name.h"
#include "util/mpi_check.h"
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>
#include <torch/cuda.h>

#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iostream>
#include <map>
#include <sstream>
#include <stdexcept>
#include <vector>

namespace ddp {

namespace {

// Returns true when this call initialised MPI (and so must finalise it).
bool init_mpi(int* argc, char*** argv, int* provided, bool yield) {
  int initialized = 0;
  DDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized) {
    DDP_MPI_CHECK(MPI_Query_thread(provided));
    return false;
  }
  // MPI communicators all-reduce on worker threads beside the training thread, and
  // Open MPI busy-polls while a collective waits; it only yields the core by itself when it
  // sees more ranks than cores, which the extra thread hides from it. yield_when_idle()
  // (launcher.h) decides from the node's threads and CPUs. A value the user set wins.
  if (yield) setenv("OMPI_MCA_mpi_yield_when_idle", "1", /*overwrite=*/0);
  // MULTIPLE lets the communicators' worker threads and the training thread all call MPI.
  DDP_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, provided));
  return true;
}

bool launch_checks_enabled() {
  return !read_flag(current_environment(), Setting::SkipLaunchChecks);
}

// The first Runtime of the process prints the banner and sets the thread count; a second one
// (a library inside the program creating its own) repeats neither.
std::atomic<bool> g_first_runtime_done{false};

// launcher.h's keep_freed_memory, applied (glibc only: another C library's malloc is left alone).
void keep_freed_memory_unless_tuned() {
#ifdef __GLIBC__
  if (!keep_freed_memory(current_environment())) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest
  mallopt(M_TRIM_THRESHOLD, INT_MAX);
#endif
}

// Whether Open MPI should yield the core while it waits (launcher.h's yield_when_idle).
bool yield_before_init(const LaunchInfo& launch) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cpus = 1;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) cpus = CPU_COUNT(&mask);
  return yield_when_idle(current_environment(), launch.local_size, cpus);
}

// Reads how the job was launched and ends the process when that launch cannot work, before
// MPI_Init, whose own failure would say nothing useful.
LaunchInfo check_launch_before_mpi_init() {
  // Read before MPI_Init: what the launcher set, not what the MPI library adds.
  LaunchInfo launch = detect_launch(current_environment());
  int initialized = 0;
  DDP_MPI_CHECK(MPI_Initialized(&initialized));
  if (initialized || !launch_checks_enabled()) return launch;
#ifdef OPEN_MPI
  const std::string error = launch_error_before_mpi_init(launch, /*open_mpi=*/true);
#else
  const std::string error = launch_error_before_mpi_init(launch, /*open_mpi=*/false);
#endif
  if (error.empty()) return launch;
  // Without MPI there is no MPI_Abort: every process stops, the first one says why.
  if (launch.rank <= 0) {
    std::cerr << "ddp: rank 0 ("
              << (launch.slurm_node.empty() ? detail::host_name("?") : launch.slurm_node)
              << "): " << error << std::endl;
  }
  std::exit(1);
}

// The CPUs this rank may run on (its cpuset, as the launcher or the batch system bound it),
// and how many ranks of the node share exactly that set: all of them when nothing bound the
// ranks, one when each got its own cores. Collective on the node.
ThreadChoice choose_rank_threads(MPI_Comm node_comm, int local_size) {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  int cpus = 1;
  if (sched_getaffinity(0, sizeof(mask), &mask) == 0) cpus = CPU_COUNT(&mask);
  const uint64_t mine = hash64(&mask, sizeof mask);
  std::vector<uint64_t> masks(local_size);
  DDP_MPI_CHECK(MPI_Allgather(&mine, 1, MPI_UINT64_T, masks.data(), 1, MPI_UINT64_T, node_comm));
  const int sharing = static_cast<int>(std::count(masks.begin(), masks.end(), mine));
  return choose_threads(current_environment(), cpus, sharing);
}

// Every local rank's id of the one GPU it sees ("" if none or several); collective on the node.
std::vector<std::string> gpu_ids_on_node(const Runtime& runtime, MPI_Comm node_comm,
                                         int visible_gpus) {
  std::array<char, 40> mine{};  // a UUID is 32 hex digits
#if DDP_WITH_CUDA
  if (visible_gpus == 1) {
    try {
      const std::string uuid = detail::cuda_device_uuid(0, runtime.rank());
      std::strncpy(mine.data(), uuid.c_str(), mine.size() - 1);
    } catch (const std::exception& e) {
      runtime.abort(e.what());  // the other ranks are about to wait for this one in the gather
    }
  }
#else
  (void)runtime;
  (void)visible_gpus;
#endif
  const int width = static_cast<int>(mine.size());
  std::vector<char> all(mine.size() * runtime.local_size());
  DDP_MPI_CHECK(
      MPI_Allgather(mine.data(), width, MPI_CHAR, all.data(), width, MPI_CHAR, node_comm));
  std::vector<std::string> ids;
  for (int r = 0; r < runtime.local_size(); ++r) ids.emplace_back(all.data() + r * mine.size());
  return ids;
}

}  // namespace

Runtime::Runtime(int& argc, char**& argv, RuntimeOptions options)
    : impl_(std::make_unique<Impl>()), uncaught_at_construction_(std::uncaught_exceptions()) {
  start(&argc, &argv, options);
}

Runtime::Runtime(int /*argc*/, const char* const* /*argv*/, RuntimeOptions options)
    : Runtime(options) {}

Runtime::Runtime(RuntimeOptions options)
    : impl_(std::make_unique<Impl>()), uncaught_at_construction_(std::uncaught_exceptions()) {
  start(nullptr, nullptr, options);
}

void Runtime::start(int* argc, char*** argv, RuntimeOptions options) {
  if (options.startup_timeout.count() < 0) {
    // Before MPI: every rank throws the same, none waits for another.
    throw std::invalid_argument(
        "RuntimeOptions::startup_timeout must be >= 0 seconds (0: "
        "DDP_STARTUP_TIMEOUT_SECONDS, else 600), got " +
        std::to_string(options.startup_timeout.count()));
  }
  impl_->launch = check_launch_before_mpi_init();
  detail::set_phase_identity(impl_->launch.rank, impl_->launch.slurm_node);
  {
    const auto phase = detail::startup_phase(
        "MPI start-up (MPI_Init)",
        "MPI_Init returns once every rank of the job has started; a rank is stopped, dead, or "
        "still starting (its node's file system loading the program or its libraries)",
        options.startup_timeout);
    owns_mpi_ = init_mpi(argc, argv, &thread_level_, yield_before_init(impl_->launch));
  }
  detail::set_phase_mpi_ready(true);
  {
    const auto phase = detail::startup_phase(
        "the Runtime's start-up collectives (topology, GPUs)",
        "every rank must reach them; one is stopped, or hangs before its Runtime",
        options.startup_timeout);
    init_topology(options);
  }
  detail::set_phase_identity(rank_, hostname_);
}

void Runtime::init_topology(RuntimeOptions options) {
  MPI_Comm& comm = impl_->comm;
  DDP_MPI_CHECK(MPI_Comm_dup(MPI_COMM_WORLD, &comm));
  // Errors come back as codes, so DDP_MPI_CHECK can report them with MPI's message.
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  MPI_Comm world = comm;
  DDP_MPI_CHECK(MPI_Comm_rank(world, &rank_));
  DDP_MPI_CHECK(MPI_Comm_size(world, &world_size_));

  char name[MPI_MAX_PROCESSOR_NAME];
  int length = 0;
  DDP_MPI_CHECK(MPI_Get_processor_name(name, &length));
  hostname_.assign(name, length);

  // Ranks that share memory are on one node: that is what "local" means, whatever the
  // launcher's environment variables say.
  MPI_Comm node_comm;
  DDP_MPI_CHECK(MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node_comm));
  DDP_MPI_CHECK(MPI_Comm_rank(node_comm, &local_rank_));
  DDP_MPI_CHECK(MPI_Comm_size(node_comm, &local_size_));

  // Node numbers: rank the node leaders (local rank 0) among themselves, then share the
  // leader's number with its node.
  MPI_Comm leaders;
  DDP_MPI_CHECK(MPI_Comm_split(world, local_rank_ == 0 ? 0 : MPI_UNDEFINED, rank_, &leaders));
  if (leaders != MPI_COMM_NULL) {
    DDP_MPI_CHECK(MPI_Comm_rank(leaders, &node_rank_));
    DDP_MPI_CHECK(MPI_Comm_size(leaders, &num_nodes_));
    DDP_MPI_CHECK(MPI_Comm_free(&leaders));
  }
  int node_info[2] = {node_rank_, num_nodes_};
  DDP_MPI_CHECK(MPI_Bcast(node_info, 2, MPI_INT, 0, node_comm));
  node_rank_ = node_info[0];
  num_nodes_ = node_info[1];
  ThreadChoice& threads = impl_->threads;
  threads = choose_rank_threads(node_comm, local_size_);
  // With OMP_NUM_THREADS set, LibTorch already follows it.
  if (!threads.from_user && !g_first_runtime_done) at::set_num_threads(threads.threads);
  if (!g_first_runtime_done) keep_freed_memory_unless_tuned();
  visible_gpus_ = options.use_cuda && torch::cuda::is_available()
                      ? static_cast<int>(torch::cuda::device_count())
                      : 0;
  own_gpu_ = each_rank_sees_its_own_gpu(gpu_ids_on_node(*this, node_comm, visible_gpus_));
  DDP_MPI_CHECK(MPI_Comm_free(&node_comm));

  if (launch_checks_enabled()) {
    const std::string error = launch_error(impl_->launch, world_size_);
    if (!error.empty()) abort(error);
  }

  try {
    device_ = select_device(options.use_cuda, visible_gpus_, local_rank_, local_size_, own_gpu_);
#if DDP_WITH_CUDA
    if (device_.is_cuda()) detail::set_current_cuda_device(device_.index(), rank_);
#endif
  } catch (const std::exception& e) {
    abort(e.what());  // a placement error on every rank: end the job with the reason
  }
  report_job(options);
  g_first_runtime_done = true;
}

void Runtime::report_job(const RuntimeOptions& options) const {
  // Rank 0 learns every rank's place in one gather; fixed-size records keep it a single call.
  struct Place {
    int node_rank, local_size, on_cuda, threads, gpus;
    char node[64];
  };
  const LaunchInfo& launch = impl_->launch;
  Place mine{node_rank_,
             local_size_,
             device_.is_cuda() ? 1 : 0,
             impl_->threads.threads,
             gpus_to_pair(current_environment(), visible_gpus_, local_size_, own_gpu_),
             {}};
  const std::string node = launch.slurm_node.empty() ? hostname_ : launch.slurm_node;
  std::strncpy(mine.node, node.c_str(), sizeof(mine.node) - 1);
  std::vector<Place> all(rank_ == 0 ? world_size_ : 0);
  DDP_MPI_CHECK(MPI_Gather(&mine, sizeof(Place), MPI_BYTE, all.data(), sizeof(Place), MPI_BYTE, 0,
                           impl_->comm));
  if (rank_ != 0 || g_first_runtime_done) return;

  std::vector<RankPlace> places;
  std::map<int, Place> first_of_node;
  std::map<int, bool> node_uses_cuda;
  for (const Place& p : all) {
    places.push_back({p.node_rank, p.local_size, p.on_cuda != 0, p.threads});
    first_of_node.emplace(p.node_rank, p);
    node_uses_cuda[p.node_rank] = node_uses_cuda[p.node_rank] || p.on_cuda != 0;
  }
  if (options.print_banner) {
    std::cout << describe_job(launch, places, impl_->threads) << std::endl;
  }
  for (const auto& [node_rank, p] : first_of_node) {
    const std::string warning =
        gpu_rank_mismatch(p.gpus, p.local_size, p.node, node_uses_cuda[node_rank]);
    if (!warning.empty()) std::cerr << "ddp: warning: " << warning << std::endl;
  }
}

Runtime::~Runtime() {
  if (detail::mpi_finalized()) return;
  if (std::uncaught_exceptions() > uncaught_at_construction_) {
    abort(
        "an exception is unwinding past ddp::Runtime; ending the job (catch it, or use "
        "ddp::run_or_abort to print it first)");
  }
  if (impl_->comm != MPI_COMM_NULL) MPI_Comm_free(&impl_->comm);
  if (owns_mpi_) {
    detail::set_phase_mpi_ready(false);
    // Open MPI's MPI_Finalize waits for every rank: one stopped after its work would keep the
    // others here, everything saved, until the batch system's time limit.
    const auto phase = detail::setup_phase(
        "MPI shutdown (MPI_Finalize)",
        "it returns once every rank has called it; a rank is stopped or hangs before its end");
    MPI_Finalize();
  }
}

std::string Runtime::summary() const {
  std::ostringstream out;
  out << "rank " << rank_ << "/" << world_size_ << " local " << local_rank_ << "/" << local_size_
      << " node " << node_rank_ << "/" << num_nodes_ << " host " << hostname_ << " device "
      << device_;
  return out.str();
}

void Runtime::abort(const std::string& message, int exit_code) const {
  detail::abort_job(rank_, hostname_, message, exit_code);
}

void detail::abort_job(int rank, const std::string& host, const std::string& message,
                       int exit_code) {
  // One write, so other ranks' output cannot land inside the line.
  const std::string line =
      "ddp: rank " + std::to_string(rank) + " (" + host + "): " + message + "\n";
  std::fwrite(line.data(), 1, line.size(), stderr);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);  // MPI_Abort does not return; this satisfies [[noreturn]]
}

int run_or_abort(const Runtime& runtime, const std::function<void()>& body) {
  try {
    body();
    return 0;
  } catch (const c10::Error& e) {
    runtime.abort(e.what_without_backtrace());  // LibTorch's message without its stack dump
  } catch (const std::exception& e) {
    runtime.abort(e.what());
  } catch (...) {
    runtime.abort("unknown exception");
  }
}

}  // namespace ddp
