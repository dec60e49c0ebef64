// The cost of the Trainer's per-step stop check (docs/records/reliability.md): the all-reduce (Max)
// of 6 doubles (what StopAgreement sends) on the process group's CPU communicator, timed one by
// one. Reports the median and the 90th percentile over the slowest rank, in microseconds, so that a
// rank descheduled now and then on a busy machine does not hide the typical cost.
//   mpirun -np 2 bench_stop_check [ITERATIONS]
#include <ddp/train/train.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    const int iterations = argc > 1 ? std::stoi(argv[1]) : 2000;
    std::vector<double> micros;
    for (int i = -100; i < iterations; ++i) {  // 100 to warm up
      torch::Tensor flag = torch::tensor({0.0, -1.0, -1.0, -1.0, -1.0, 0.0}, torch::kDouble);
      const auto start = std::chrono::steady_clock::now();
      group.cpu().all_reduce(flag, ddp::ReduceOp::Max);
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
              .count();
      if (i >= 0) micros.push_back(us);
    }
    // Per iteration, the slowest rank's time.
    torch::Tensor all = torch::tensor(micros, torch::kDouble);
    group.cpu().all_reduce(all, ddp::ReduceOp::Max);
    std::vector<double> slowest(all.data_ptr<double>(), all.data_ptr<double>() + all.numel());
    std::sort(slowest.begin(), slowest.end());
    if (runtime.is_main()) {
      std::printf(
          "stop check (all-reduce Max of 6 doubles), %d ranks, %d iterations: median %.1f us, "
          "p90 %.1f us, max %.1f us\n",
          runtime.world_size(), iterations, slowest[slowest.size() / 2],
          slowest[slowest.size() * 9 / 10], slowest.back());
    }
  });
}
