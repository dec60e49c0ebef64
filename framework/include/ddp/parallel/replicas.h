#pragma once
// Several replicas in one process, one thread each: what a process does when it is given more
// GPUs than it has local ranks (`srun -N 2 --gpus-per-node 2` starts one task per node), and on
// the CPU with --replicas-per-process N. Each replica thread runs the same training body a rank
// runs, with a ProcessGroup whose rank() is the replica's index in the job
// (Runtime::rank() * N + replica) and whose size() is the job's replica count, so
// DistributedDataParallel, the DistributedSampler, the Trainer's metrics, evaluation,
// checkpoints (written once, by replica 0 of rank 0) and replica checks all count replicas.
//
//   ddp::Runtime runtime(argc, argv, options);            // options.replicas_per_process
//   return ddp::run_or_abort(runtime, [&] {
//     ddp::run_replicas(runtime, [&](ddp::ProcessGroup& group) {
//       std::shared_ptr<Net> net;
//       ddp::build_seeded(seed, group.device(), [&] { net = std::make_shared<Net>(); });
//       net->to(group.device());
//       ddp::DistributedDataParallel model(group, net);
//       ...                                                 // as on a rank
//       return 0;
//     });
//   });
//
// Communication (docs/architecture.md): on the CPU the replicas of a process reduce in memory,
// then across processes over MPI (comm/replica_communicator.h); on GPUs each replica has its
// own NCCL communicator, all of the process's created in one NCCL group call
// (NcclCommunicator::create_for_devices), ranks numbered over every device of the job.
//
// Each replica thread: installs a CPU generator of its own (util/generator.h: draw through
// ddp::cpu_generator(), build the model with ddp::build_seeded, use ddp::dropout), makes its
// device current, and runs with Runtime::replica_threads() intra-op threads.
//
// Errors: an exception escaping one replica's body stops the process's other replicas (their
// collectives end with ReplicasAborted) and ends the job like an error on a rank, naming the
// rank and the replica: "ddp: rank 1 (host): replica 1 of 2 (replica 3 of the job's 4): ...".

#include <ddp/comm/communicator.h>
#include <ddp/comm/replica_communicator.h>
#include <ddp/parallel/process_group.h>
#include <ddp/runtime/runtime.h>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ddp {

class ProcessGroup;

// What the replica threads of one process share: the in-memory hub for CPU collectives and, on
// GPUs, the process's NCCL communicators. run_replicas() makes one; ProcessGroup uses it.
class ReplicaSet {
 public:
  // Runtime::replicas_per_process() replicas; `options` are every replica's group's.
  explicit ReplicaSet(Runtime& runtime, ProcessGroupOptions options = {});
  ~ReplicaSet();
  ReplicaSet(const ReplicaSet&) = delete;
  ReplicaSet& operator=(const ReplicaSet&) = delete;

  Runtime& runtime() const { return runtime_; }
  const ProcessGroupOptions& options() const { return options_; }
  int size() const { return replicas_; }
  ReplicaHub& hub() { return *hub_; }

  // The NCCL communicator of `replica`'s device. The first call creates those of every replica
  // of the process, collectively over the processes (ProcessGroup::gpu(), called by every
  // replica). Throws std::runtime_error when this build has no NCCL communicator.
  std::shared_ptr<Communicator> nccl(int replica);

 private:
  Runtime& runtime_;
  ProcessGroupOptions options_;
  int replicas_;
  std::unique_ptr<ReplicaHub> hub_;
  std::mutex nccl_mutex_;
  std::vector<std::shared_ptr<Communicator>> nccl_;
};

// Runs `body` once per replica of this process (Runtime::replicas_per_process()), each on a
// thread of its own with its own ProcessGroup (all with `options`), and returns replica 0's result once all have
// returned. With one replica: `body` on the calling thread with ProcessGroup(runtime), exactly
// what a program without replicas does. An exception from any replica's body ends the job
// (Runtime::abort) naming the rank and the replica; with one replica it propagates, as it would
// without run_replicas.
int run_replicas(Runtime& runtime, const std::function<int(ProcessGroup&)>& body,
                 ProcessGroupOptions options = {});

// "replica 1 of 2 (replica 3 of the job's 4)": how errors name a replica.
std::string describe_replica(int replica, int replicas, int rank, int size);

}  // namespace ddp
