// A job in which the last rank fails while the others wait in a collective. The job must end
// quickly with a message naming the failed rank, never hang.
//   abort_probe throw : the rank throws; ddp::run_or_abort reports it and aborts the job
//   abort_probe exit  : the rank dies without a word (exit without MPI_Finalize)
//   abort_probe replica : 2 replicas per process; replica 1 of the last rank throws while its
//                       sibling and the other processes' replicas wait in a collective
//   abort_probe replica_hang : 2 replicas in each process, timeout 2 s; replica 1 of the last
//                       rank hangs (sleeps) while its sibling waits for it in memory
#include <ddp/process_group.h>
#include <ddp/replicas.h>
#include <ddp/runtime.h>

#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw";
  ddp::RuntimeOptions options;
  if (mode == "replica" || mode == "replica_hang") options.replicas_per_process = 2;
  ddp::Runtime runtime(argc, argv, options);
  if (mode == "replica") {
    return ddp::run_or_abort(runtime, [&] {
      ddp::run_replicas(runtime, [&](ddp::ProcessGroup& group) {
        if (group.rank() == group.size() - 1) {
          throw std::runtime_error("deliberate failure in replica " + std::to_string(group.rank()));
        }
        torch::Tensor t = torch::ones({4});
        group.cpu().all_reduce(t);  // never completes: the last replica is gone
        return 0;
      });
    });
  }
  if (mode == "replica_hang") {
    ddp::ProcessGroupOptions group_options;
    group_options.timeout = std::chrono::seconds(2);
    return ddp::run_or_abort(runtime, [&] {
      ddp::run_replicas(runtime, [&](ddp::ProcessGroup& group) {
        if (group.rank() == group.size() - 1) {
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));  // hung
        }
        torch::Tensor t = torch::ones({4});
        group.cpu().all_reduce(t);  // its sibling never comes: the hub's timeout ends it
        return 0;
      }, group_options);
    });
  }
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    if (runtime.rank() == runtime.world_size() - 1) {
      if (mode == "exit") std::_Exit(3);
      throw std::runtime_error("deliberate failure in the probe");
    }
    group.cpu().barrier();  // never completes: the last rank is gone
  });
}
