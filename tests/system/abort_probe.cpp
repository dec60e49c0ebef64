// A job in which the last rank fails while the others wait in a collective. The job must end
// quickly with a message naming the failed rank, never hang.
//   abort_probe throw : the rank throws; ddp::run_or_abort reports it and aborts the job
//   abort_probe exit  : the rank dies without a word (exit without MPI_Finalize)
#include <ddp/process_group.h>
#include <ddp/runtime.h>

#include <cstdlib>
#include <stdexcept>
#include <string>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "throw";
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    if (runtime.rank() == runtime.world_size() - 1) {
      if (mode == "exit") std::_Exit(3);
      throw std::runtime_error("deliberate failure in the probe");
    }
    group.cpu().barrier();  // never completes: the last rank is gone
  });
}
