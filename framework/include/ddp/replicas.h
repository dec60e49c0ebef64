#pragma once
/// \file
/// Several replicas in one process, one thread each: what a process does when it is given more
/// GPUs than it has local ranks (`srun -N 2 --gpus-per-node 2` starts one task per node), and on
/// the CPU with --replicas-per-process N. Each replica thread runs the same training body a rank
/// runs, with a ProcessGroup whose rank() is the replica's index in the job
/// (Runtime::rank() * N + replica) and whose size() is the job's replica count, so
/// DistributedDataParallel, the DistributedSampler, the Trainer's metrics, evaluation,
/// checkpoints (written once, by replica 0 of rank 0) and replica checks all count replicas.
///
///   ddp::Runtime runtime(argc, argv, options);            // options.replicas_per_process
///   return ddp::run_or_abort(runtime, [&] {
///     ddp::run_replicas(runtime, [&](ddp::ProcessGroup& group) {
///       std::shared_ptr<Net> net;
///       ddp::build_seeded(seed, group.device(), [&] { net = std::make_shared<Net>(); });
///       net->to(group.device());
///       ddp::DistributedDataParallel model(group, net);
///       ...                                                 // as on a rank
///       return 0;
///     });
///   });
///
/// Communication (docs/architecture.md): on the CPU the replicas of a process reduce in memory,
/// then across processes over MPI (comm/replica_communicator.h); on GPUs each replica has its
/// own NCCL communicator, all of the process's created in one NCCL group call, ranks numbered
/// over every device of the job.
///
/// Each replica thread: installs a CPU generator of its own (draw through ddp::cpu_generator(),
/// build the model with ddp::build_seeded, use ddp::dropout of the training kit), makes its
/// device current, and runs with its share of the process's intra-op threads.
///
/// Errors: an exception escaping one replica's body stops the process's other replicas (their
/// collectives end with ReplicasAborted) and ends the job like an error on a rank, naming the
/// rank and the replica: "ddp: rank 1 (host): replica 1 of 2 (replica 3 of the job's 4): ...".

#include <ddp/process_group.h>
#include <ddp/runtime.h>

#include <ATen/core/Generator.h>
#include <torch/types.h>

#include <cstdint>
#include <functional>

namespace ddp {

/// Runs `body` once per replica of this process (Runtime::replicas_per_process()), each on a
/// thread of its own with its own ProcessGroup (all with `options`), and returns replica 0's
/// result once all have returned. With one replica: `body` on the calling thread with
/// ProcessGroup(runtime), exactly what a program without replicas does. An exception from any
/// replica's body ends the job (Runtime::abort) naming the rank and the replica; with one replica
/// it propagates, as it would without run_replicas.
int run_replicas(Runtime& runtime, const std::function<int(ProcessGroup&)>& body,
                 ProcessGroupOptions options = {});

// Random numbers per replica. LibTorch has one default CPU generator per process, seeded by
// torch::manual_seed; a rank draws its dropout masks from it. Replicas that share a process must
// not share it: their draws would interleave in whatever order the threads run, and no replica
// would draw what the rank it stands for draws. So each replica thread has a generator of its
// own, and whatever draws for a replica asks cpu_generator(). LibTorch's module constructors draw
// their initial weights from the default generator, which nothing can redirect: build_seeded()
// builds under a process-wide lock from the default generator seeded as torch::manual_seed
// would, then hands the generator's state to the thread's own. Each replica therefore starts
// from exactly the state a rank would be in after `torch::manual_seed(seed); build();`, which
// makes N replicas in one process train what N ranks train.

/// The calling thread's CPU generator (a shared handle, not a copy): the replica thread's own
/// inside run_replicas, LibTorch's default generator elsewhere.
at::Generator cpu_generator();

/// torch::manual_seed(seed), then build(), as one step for the calling thread's replica. Outside
/// a replica thread: exactly that. In one: under a process-wide lock, seeds LibTorch's default CPU
/// generator (and `device`'s default generator when it is a CUDA device; no other device's,
/// which another replica may be drawing from), runs build(), and copies the default CPU
/// generator's state into the thread's.
void build_seeded(uint64_t seed, torch::Device device, const std::function<void()>& build);

}  // namespace ddp
