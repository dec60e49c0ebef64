#pragma once
// Collectives for several replicas in one process, one thread each (--replicas-per-process N):
// each replica thread gets a Communicator whose rank is its global replica index
// (process_rank * N + replica) and whose size is the job's replica count (processes * N), so
// everything built on a Communicator (DistributedDataParallel's Reducer, the sampler's shard,
// the Trainer's metrics, snapshots, replica checks) runs unchanged on each thread, as it runs on
// a rank.
//
// How a collective runs: the N threads of the process meet in memory; the last to arrive combines
// the N tensors in replica order (0 + 1 + ... + N-1: a fixed order, so the result does not depend
// on which thread came last), hands the partial result to a communicator over the processes
// (ProcessGroup's CPU communicator: MPI, and the TCP ring for large all-reduces between hosts)
// and, when that returns, every replica's tensor receives the result.
// With one process there is nothing to send: the hub reduces in memory only (the unit tests run
// it so, without MPI). CPU tensors only: replicas on GPUs use one NCCL communicator per device.
//
// Channels: each ReplicaHub::communicator() call is collective over the replica threads: the k-th
// call of every replica returns that replica's end of channel k, with a process communicator of
// its own (what ProcessGroup::new_cpu_communicator() is for a rank). Within a channel every
// replica issues the same collectives in the same order (communicator.h's contract).
//
// Timeout: the hub's (ProcessGroupOptions::timeout, as every collective's) bounds how long a
// replica waits in memory for its siblings: a replica that hangs in its own code (or calls
// another collective) would otherwise hold the others forever, even in a one-process job where
// no MPI watchdog runs. The waiting replica's collective then throws std::runtime_error naming
// the collective and the replicas that never came, and aborts the hub; the replica runner ends
// the job with it. Once every replica has come, the collective is in the process communicator,
// whose own watchdog covers it.
//
// Failure: a replica thread that fails cannot reach the next collective, and the other threads
// would wait for it forever. ReplicaHub::abort() ends every wait on the hub, now and later, with
// ReplicasAborted carrying the reason; the replica runner (parallel/replicas.h) calls it before it
// ends the job, so no thread of this process is left waiting in memory.

#include <ddp/communicator.h>

#include <chrono>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace ddp {

// Thrown by a collective on a hub that was aborted (another replica thread failed).
struct ReplicasAborted : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class ReplicaHub {
 public:
  // Makes a communicator over the processes (one per channel; called on one thread at a time,
  // in channel order, so every process creates them in the same order).
  using ProcessCommFactory = std::function<std::unique_ptr<Communicator>()>;

  // `replicas` threads in this process, which is `process_rank` of `processes`. With more than
  // one process, `make_process_comm` must be set. `timeout`: see above; 0 waits without end.
  // Throws std::invalid_argument naming the bad argument.
  ReplicaHub(int replicas, int process_rank, int processes, ProcessCommFactory make_process_comm,
             std::chrono::seconds timeout = std::chrono::seconds(0));
  ~ReplicaHub();
  ReplicaHub(const ReplicaHub&) = delete;
  ReplicaHub& operator=(const ReplicaHub&) = delete;

  int replicas() const { return replicas_; }
  int process_rank() const { return process_rank_; }
  int processes() const { return processes_; }

  // Replica `replica`'s end of the next channel (see above). Collective over the processes only
  // when this call creates the channel (the first replica to get there).
  std::unique_ptr<Communicator> communicator(int replica);

  // Ends every collective waiting on this hub, and every later one, with ReplicasAborted(reason).
  // Any thread; idempotent (the first reason stays).
  void abort(const std::string& reason);
  bool aborted() const;

  struct State;  // shared with the channels and communicators (replica_communicator.cpp)

 private:
  int replicas_, process_rank_, processes_;
  ProcessCommFactory make_process_comm_;
  std::shared_ptr<State> state_;
};

}  // namespace ddp
