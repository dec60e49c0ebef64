#include <ddp/replicas.h>

#include <ddp/config.h>

#include "comm/replica_communicator.h"
#include "parallel/backend_options.h"
#include "parallel/generator.h"
#include "parallel/group_membership.h"
#include "runtime/launcher.h"
#include "runtime/runtime_internals.h"
#include "util/environment.h"
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include "comm/nccl_communicator.h"
#endif
#if DDP_WITH_CUDA
#include "util/cuda_device.h"
#endif

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace ddp {

namespace {

// "replica 1 of 2 (replica 3 of the job's 4)": how errors name a replica.
std::string describe_replica(int replica, int replicas, int rank, int size) {
  return "replica " + std::to_string(replica) + " of " + std::to_string(replicas) +
         " (replica " + std::to_string(rank) + " of the job's " + std::to_string(size) + ")";
}

// What the replica threads of one process share: the in-memory hub for CPU collectives and, on
// GPUs, the process's NCCL communicators.
class ReplicaSet {
 public:
  ReplicaSet(Runtime& runtime, ProcessGroupOptions options)
      : runtime_(runtime), options_(options), replicas_(runtime.replicas_per_process()) {
    set_phase_timeout(collective_timeout(options.timeout));  // as ProcessGroup's constructor
    const Runtime* owner = &runtime;
    const std::chrono::seconds timeout = options.timeout;
    // The replicas' waits in memory get the collectives' timeout (0: DDP_TIMEOUT_SECONDS, else
    // 600 s), so a hung replica thread ends even a one-process job.
    const std::chrono::seconds hub_timeout =
        timeout.count() > 0 ? timeout
                            : std::chrono::seconds(collective_timeout_seconds(current_environment()));
    // Each channel's communicator over the processes is what ProcessGroup's would be.
    hub_ = std::make_unique<ReplicaHub>(replicas_, runtime.rank(), runtime.world_size(),
                                        [owner, options] {
      return make_cpu_communicator(*owner, options);
    }, hub_timeout);
  }
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  Runtime& runtime() const { return runtime_; }
  int size() const { return replicas_; }
  ReplicaHub& hub() { return *hub_; }

  // The NCCL communicator of `replica`'s device. The first call creates those of every replica
  // of the process, collectively over the processes (ProcessGroup::gpu(), called by every
  // replica).
  std::shared_ptr<Communicator> nccl(int replica) {
    std::lock_guard<std::mutex> lock(nccl_mutex_);
    if (nccl_.empty()) {
#if DDP_WITH_CUDA && DDP_WITH_NCCL
      std::vector<torch::Device> devices;
      for (int r = 0; r < replicas_; ++r) devices.push_back(runtime_.replica_device(r));
      const NcclOptions options = nccl_options_from_environment(runtime_, options_.timeout);
      for (auto& comm : NcclCommunicator::create_for_devices(
               detail::RuntimeInternals::comm(runtime_), runtime_.rank(),
               runtime_.rank() * replicas_, runtime_.world_size() * replicas_, devices, options)) {
        nccl_.push_back(std::shared_ptr<Communicator>(std::move(comm)));
      }
#else
      throw std::runtime_error("ReplicaSet::nccl: this build of ddp has no NCCL communicator");
#endif
    }
    return nccl_.at(static_cast<size_t>(replica));
  }

 private:
  Runtime& runtime_;
  ProcessGroupOptions options_;
  int replicas_;
  std::unique_ptr<ReplicaHub> hub_;
  std::mutex nccl_mutex_;
  std::vector<std::shared_ptr<Communicator>> nccl_;
};

// One replica thread's place in its set.
class ReplicaMembership final : public detail::GroupMembership {
 public:
  ReplicaMembership(ReplicaSet& set, int replica) : set_(set), replica_(replica) {}
  int replica() const override { return replica_; }
  int replicas_per_process() const override { return set_.size(); }
  std::unique_ptr<Communicator> new_cpu_communicator(const std::string&) override {
    return set_.hub().communicator(replica_);
  }
  std::shared_ptr<Communicator> gpu_communicator() override { return set_.nccl(replica_); }
  std::string describe() const override {
    const Runtime& runtime = set_.runtime();
    const int n = set_.size();
    return " (" + describe_replica(replica_, n, runtime.rank() * n + replica_,
                                   runtime.world_size() * n) + ")";
  }

 private:
  ReplicaSet& set_;
  int replica_;
};

}  // namespace

namespace {

std::string message_of(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();  // LibTorch's message without its stack dump
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace

int run_replicas(Runtime& runtime, const std::function<int(ProcessGroup&)>& body,
                 ProcessGroupOptions options) {
  const int n = runtime.replicas_per_process();
  if (n == 1) {
    ProcessGroup group(runtime, options);
    return body(group);
  }
  ReplicaSet set(runtime, options);
  const ThreadChoice& choice = detail::RuntimeInternals::replica_threads(runtime);
  const int threads = choice.threads;
  const bool set_threads = !choice.from_user;
  std::vector<int> status(static_cast<size_t>(n), 0);
  std::atomic<bool> failing{false};
  auto replica_main = [&](int r) {
    const int global = runtime.rank() * n + r;
    try {
      // Per thread: LibTorch's intra-op count (OpenMP's is a per-thread setting), the device,
      // the generator.
      if (set_threads) at::set_num_threads(threads);
#if DDP_WITH_CUDA
      const torch::Device device = runtime.replica_device(r);
      if (device.is_cuda()) detail::set_current_cuda_device(device.index(), global);
#endif
      ThreadCpuGenerator generator;
      ProcessGroup group(runtime, std::make_unique<ReplicaMembership>(set, r));
      status[static_cast<size_t>(r)] = body(group);
    } catch (const ReplicasAborted&) {
      // Another replica failed first and is ending the job; nothing to add.
    } catch (...) {
      const std::string message = message_of(std::current_exception());
      set.hub().abort("replica " + std::to_string(r) + " failed: " + message);
      if (!failing.exchange(true)) {
        runtime.abort(describe_replica(r, n, global, runtime.world_size() * n) + ": " + message);
      }
      // Another replica is ending the job already: wait for it.
      for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
    }
  };
  std::vector<std::thread> pool;
  for (int r = 0; r < n; ++r) pool.emplace_back(replica_main, r);
  for (auto& t : pool) t.join();
  if (set.hub().aborted()) {
    // Only a failure aborts the hub, and a failure ends the job: not reached in practice.
    throw std::runtime_error("run_replicas: a replica failed");
  }
  return status[0];
}

}  // namespace ddp
