// All-reduce bandwidth in the style of nccl-tests: ddp's CPU communicator (what ProcessGroup
// makes: MPI, with the TCP ring for large all-reduces where --sockets says) against raw
// MPI_Allreduce on the same buffers, float32 sum, in place, sizes doubling from --min-bytes to
// --max-bytes. Each iteration is timed alone between barriers (untimed re-initialisation), the
// time is the mean over iterations of the slowest rank, and every result is checked.
//   algbw = bytes / time;  busbw = algbw * 2 (n - 1) / n  (the per-rank traffic of a ring)
//   mpirun -np 2 bench_allreduce --min-bytes 4096 --max-bytes 268435456
//                                [--sockets auto|never|always]
// --sockets: CpuOptions::sockets for the ddp column (auto: the TCP ring between hosts only;
// always: all-reduces of 64 KiB or more on the ring, on one host too).
#include "comm/compose/cpu_communicator.h"
#include "runtime/runtime_internals.h"
#include <ddp/runtime.h>

#include <mpi.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

namespace {

struct Result {
  double seconds;  // mean per all-reduce, slowest rank
  int64_t wrong;   // elements differing from the exact sum, all ranks
};

template <typename AllReduce>
Result measure(ddp::Communicator& comm, torch::Tensor& buffer, int iters, AllReduce all_reduce) {
  const int w = comm.size();
  const float mine = static_cast<float>(comm.rank() + 1);
  const float expected = static_cast<float>(w * (w + 1) / 2);  // small integers: exact in float
  double total = 0;
  int64_t wrong = 0;
  for (int i = -1; i < iters; ++i) {  // iteration -1 warms up
    buffer.fill_(mine);
    comm.barrier();
    const auto start = std::chrono::steady_clock::now();
    all_reduce(buffer);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (i >= 0) total += seconds;
    if (i == iters - 1) wrong = buffer.ne(expected).sum().item<int64_t>();
  }
  torch::Tensor stats = torch::tensor({total / iters, static_cast<double>(wrong)}, torch::kDouble);
  comm.all_reduce(stats, ddp::ReduceOp::Max);
  return {stats[0].item<double>(), static_cast<int64_t>(stats[1].item<double>()) * w};
}

int64_t parse_bytes(const char* text) {
  char* end = nullptr;
  double value = std::strtod(text, &end);
  const std::string unit = end ? end : "";
  if (unit == "K" || unit == "KiB")
    value *= 1024;
  else if (unit == "M" || unit == "MiB")
    value *= 1024 * 1024;
  else if (!unit.empty())
    throw std::invalid_argument(std::string("bad size: ") + text);
  return static_cast<int64_t>(value);
}

}  // namespace

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  return ddp::run_or_abort(runtime, [&] {
    int64_t min_bytes = 4096, max_bytes = 256LL << 20;
    ddp::CpuOptions options;
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--min-bytes")
        min_bytes = parse_bytes(argv[i + 1]);
      else if (flag == "--max-bytes")
        max_bytes = parse_bytes(argv[i + 1]);
      else if (flag == "--sockets")
        options.sockets = ddp::parse_sockets(argv[i + 1], "--sockets");
      else
        throw std::invalid_argument("unknown flag " + flag +
                                    " (--min-bytes, --max-bytes, --sockets)");
    }
    const std::unique_ptr<ddp::Communicator> made =
        ddp::make_cpu_communicator(ddp::detail::RuntimeInternals::comm(runtime), options);
    ddp::Communicator& comm = *made;
    // The raw column's communicator: the MPI backend's own duplicate.
    const auto* routed = dynamic_cast<const ddp::SizeRoutedCommunicator*>(made.get());
    const MPI_Comm raw_comm =
        routed ? routed->mpi().comm() : dynamic_cast<const ddp::MpiCommunicator&>(comm).comm();
    const int w = comm.size();
    const double bus_factor = w > 1 ? 2.0 * (w - 1) / w : 0.0;
    if (runtime.is_main()) {
      const char* sockets = ddp::to_string(options.sockets);
      std::printf(
          "# all-reduce, float32 sum, in place, %d ranks on %d node(s), OMP_NUM_THREADS=%s, ddp: "
          "one MPI call per tensor, socket ring %s (from %zu KiB)\n",
          w, runtime.num_nodes(),
          std::getenv("OMP_NUM_THREADS") ? std::getenv("OMP_NUM_THREADS") : "unset", sockets,
          options.socket_bytes >> 10);
      std::printf(
          "#                                   ddp CPU communicator                   raw "
          "MPI_Allreduce\n");
      std::printf("# %10s %10s %5s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %6s\n", "size(B)",
                  "count", "type", "iters", "time(us)", "algbw", "busbw", "#wrong", "time(us)",
                  "algbw", "busbw", "#wrong", "ratio");
      std::printf("# %10s %10s %5s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %6s\n", "", "", "", "",
                  "", "(GB/s)", "(GB/s)", "", "", "(GB/s)", "(GB/s)", "", "busbw");
    }
    for (int64_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      const int64_t count = bytes / static_cast<int64_t>(sizeof(float));
      torch::Tensor buffer = torch::empty({count}, torch::kFloat);
      const int iters = static_cast<int>(std::clamp<int64_t>((64LL << 20) / bytes, 5, 200));
      const Result ours = measure(
          comm, buffer, iters, [&](torch::Tensor& t) { comm.all_reduce(t, ddp::ReduceOp::Sum); });
      const Result raw = measure(comm, buffer, iters, [&](torch::Tensor& t) {
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr<float>(), static_cast<int>(t.numel()), MPI_FLOAT,
                      MPI_SUM, raw_comm);
      });
      if (!runtime.is_main()) continue;
      const double gb = static_cast<double>(bytes) / 1e9;
      std::printf(
          "  %10lld %10lld %5s %6d  %9.1f %7.2f %7.2f %6lld  %9.1f %7.2f %7.2f %6lld  %6.3f\n",
          static_cast<long long>(bytes), static_cast<long long>(count), "float", iters,
          ours.seconds * 1e6, gb / ours.seconds, gb / ours.seconds * bus_factor,
          static_cast<long long>(ours.wrong), raw.seconds * 1e6, gb / raw.seconds,
          gb / raw.seconds * bus_factor, static_cast<long long>(raw.wrong),
          raw.seconds / ours.seconds);
      std::fflush(stdout);
    }
  });
}
