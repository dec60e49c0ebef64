// Ranks that misbehave around the MPI backend's collectives, for the watchdog and the debug mode
// (ctest registers each case with the message it must print; docs/reliability.md):
//   collective_faults agree     every rank calls the same collectives (run with DDP_DEBUG=DETAIL):
//                               all pass, results checked; rank 0 prints "... agreed: OK"
//   collective_faults mismatch  collective #2: rank 1 broadcasts int64[3] while the others
//                               all-reduce float32[10] (DDP_DEBUG=DETAIL names both sides)
//   collective_faults stop      the last rank stops itself (SIGSTOP) before collective #3; the
//                               others wait in it until the watchdog (DDP_TIMEOUT_SECONDS) fires
//   collective_faults idle      rank 1 sleeps (alive) before collective #3; the watchdog of the
//                               others says what rank 1 last did
//   collective_faults signal    as idle, but rank 0 (stop handlers installed, MpiOptions::
//                               stop_grace 2 s, timeout 600 s) gets SIGTERM while it waits in #3:
//                               its watchdog ends the job 2 s later, saying so
//   collective_faults ring      as stop, on ProcessGroup's CPU communicator with every all-reduce
//                               on the TCP ring (#1 connects it): the others hang in the ring's
//                               #3 until the watchdog fires, as in MPI's
//   collective_faults across    issue 38: a DistributedDataParallel over the group; rank 0 trains
//                               a step (its gradient communicator all-reduces) while rank 1
//                               all-reduces on group.cpu(). Without DDP_DEBUG=DETAIL both wait,
//                               each in its own communicator; with it every rank names both sides
//   collective_faults interleave every rank calls the same collectives on group.cpu(), a
//                               DistributedDataParallel's two communicators and a communicator of
//                               its own, interleaved, asynchronous ones too (run with DETAIL: the
//                               group's check passes them; results checked)
//   collective_faults mpi_error what a failing MPI call of a mismatch's error class says (rank 0
//                               prints it): it points to DDP_DEBUG=DETAIL
//   collective_faults one_rank_forward  a DistributedDataParallel over Linear, BatchNorm1d,
//                               Linear; at step 2 rank 0 alone runs one more forward through the
//                               wrapper in training mode (as a program that samples on rank 0
//                               does), whose buffer broadcast the other ranks never make: the job
//                               ends naming both sides' calls, without DDP_DEBUG=DETAIL
//   collective_faults one_rank_forward_then_step  as a GAN port that samples through its
//                               generator's wrapper on rank 0 (issue 40): each step a stop
//                               agreement's all-reduce on group.cpu(), then a step through a
//                               DistributedDataParallel whose gradient bucket (128 KiB) takes the
//                               blocking path (an MPI_Ibarrier first); after step 2 rank 0 alone
//                               runs a training forward (its buffer broadcasts). Rank 1's
//                               barrier then receives rank 0's next broadcast: MPI_ERR_TRUNCATE,
//                               which Open MPI reports through MPI_COMM_WORLD's error handler;
//                               the job ends with ddp's message naming both sides' calls
//   collective_faults matrix CASE  issue 60: rank 1 calls a collective whose arguments differ
//                               from rank 0's in one way (CASE, see mismatch_case below) on
//                               group.cpu(), without DDP_DEBUG: every rank's check names both
//                               calls and the job ends, before any byte of the tensors moves
//   collective_faults world_error  rank 0 sends to a rank that does not exist on
//                               MPI_COMM_WORLD, outside any collective: the handler ProcessGroup
//                               set there ends the job with ddp's line and MPI's error
#include "comm/compose/cpu_communicator.h"
#include "comm/mpi/mpi_communicator.h"
#include "parallel/backend_options.h"
#include "runtime/runtime_internals.h"
#include "util/mpi_check.h"
#include <ddp/distributed_data_parallel.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#include <ddp/stop_signal.h>

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <thread>

namespace {

// One step of a DistributedDataParallel Linear(4, 2): its gradients all-reduced (Reducer).
void train_step(ddp::DistributedDataParallel& model, int rank) {
  torch::Tensor x = torch::full({3, 4}, 1.0 + rank);
  model.forward(x).sum().backward();
}

// "across", "interleave": the group's communicators called together (see the top).
void across_communicators(ddp::ProcessGroup& group, const std::string& mode) {
  ddp::DDPOptions options;
  options.backend = ddp::Backend::Mpi;
  ddp::DistributedDataParallel model(group, std::make_shared<torch::nn::LinearImpl>(4, 2), options);
  const int rank = group.rank(), size = group.size();
  if (mode == "across") {
    if (rank == 0) {
      train_step(model, rank);
    } else {
      group.cpu().all_reduce(torch::ones({4}));
    }
    throw std::runtime_error("collective_faults across: the mismatch went unnoticed");
  }
  std::unique_ptr<ddp::Communicator> own = group.new_cpu_communicator("the test's own");
  double expected = 0;
  for (int step = 0; step < 3; ++step) {
    torch::Tensor mine = torch::full({2}, double(rank + step), torch::kDouble);
    auto pending = own->all_reduce_async(mine);  // queued before the step's, waited after
    train_step(model, rank);
    torch::Tensor grads = model.module().parameters()[0].grad().clone();
    group.cpu().broadcast(grads, 0);  // every replica has rank 0's averaged gradients
    if (!torch::allclose(grads, model.module().parameters()[0].grad())) {
      throw std::runtime_error("collective_faults interleave: gradients differ at step " +
                               std::to_string(step));
    }
    pending->wait();
    expected = size * step + size * (size - 1) / 2.0;
    if (mine[1].item<double>() != expected) {
      throw std::runtime_error("collective_faults interleave: wrong sum at step " +
                               std::to_string(step));
    }
  }
  group.cpu().barrier();
  if (group.is_main()) {
    std::printf(
        "collective_faults: 3 steps on 4 communicators of one group agreed, results "
        "checked: OK\n");
  }
}

// "one_rank_forward" (see the top).
void one_rank_forward(ddp::ProcessGroup& group) {
  ddp::DDPOptions options;
  options.backend = ddp::Backend::Mpi;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8),
                            torch::nn::Linear(8, 2));
  ddp::DistributedDataParallel model(group, net, options);
  const int rank = group.rank();
  for (int step = 0; step < 4; ++step) {
    torch::Tensor x = torch::full({3, 4}, 1.0 + rank + step);
    if (step == 2 && rank == 0) model.forward(x);  // a sample, through the wrapper
    model.forward(x).sum().backward();
  }
  throw std::runtime_error("collective_faults one_rank_forward: the mismatch went unnoticed");
}

// "one_rank_forward_then_step" (see the top).
void one_rank_forward_then_step(ddp::ProcessGroup& group) {
  ddp::DDPOptions options;
  options.backend = ddp::Backend::Mpi;
  torch::manual_seed(0);
  torch::nn::Sequential net(torch::nn::Linear(4, 64), torch::nn::BatchNorm1d(64),
                            torch::nn::Linear(64, 512));  // 32 K weights: 128 KiB of gradients
  ddp::DistributedDataParallel model(group, net, options);
  const int rank = group.rank();
  for (int step = 0; step < 8; ++step) {
    torch::Tensor stop = torch::zeros({4}, torch::kDouble);  // a stop agreement's all-reduce
    group.cpu().all_reduce(stop, ddp::ReduceOp::Max);
    torch::Tensor x = torch::full({3, 4}, 1.0 + rank + step);
    model.forward(x).sum().backward();
    if (step == 2 && rank == 0) model.forward(x);  // a sample, through the wrapper
  }
  throw std::runtime_error(
      "collective_faults one_rank_forward_then_step: the mismatch went unnoticed");
}

// "matrix CASE" (see the top): rank 1's call differs from the others' in one way. Each case's
// byte counts match, but for "size" (the blocking path's 20000 and 40000 float32, where Open MPI
// wrote past the smaller buffer before the check) and "bigger_broadcast".
void mismatch_case(ddp::Communicator& comm, const std::string& which) {
  const bool odd = comm.rank() == 1;
  if (which == "dtype") {
    comm.all_reduce(odd ? torch::ones({10}, torch::kInt) : torch::ones({10}));
  } else if (which == "op") {
    comm.all_reduce(torch::ones({10}), odd ? ddp::ReduceOp::Max : ddp::ReduceOp::Sum);
  } else if (which == "root") {
    comm.broadcast(torch::ones({10}), odd ? 1 : 0);
  } else if (which == "bigger_broadcast") {
    comm.broadcast(torch::ones({odd ? 20 : 10}), 0);
  } else if (which == "gather_dtype") {
    comm.all_gather(odd ? torch::ones({10}, torch::kInt) : torch::ones({10}));
  } else if (which == "shape") {
    comm.all_reduce(odd ? torch::ones({5, 4}) : torch::ones({4, 5}));
  } else if (which == "size") {
    comm.all_reduce(torch::ones({odd ? 40000 : 20000}));
  } else {
    throw std::invalid_argument("collective_faults matrix: no case '" + which + "'");
  }
  throw std::runtime_error("collective_faults matrix " + which + ": the mismatch went unnoticed");
}

}  // namespace

int main(int argc, char** argv) {
  ddp::Runtime runtime(argc, argv);
  const std::string mode = argc > 1 ? argv[1] : "agree";
  return ddp::run_or_abort(runtime, [&] {
    ddp::ProcessGroup group(runtime);
    if (mode == "across" || mode == "interleave") return across_communicators(group, mode);
    if (mode == "one_rank_forward") return one_rank_forward(group);
    if (mode == "matrix") return mismatch_case(group.cpu(), argc > 2 ? argv[2] : "");
    if (mode == "one_rank_forward_then_step") return one_rank_forward_then_step(group);
    if (mode == "world_error") {
      if (runtime.is_main()) {
        const int value = 0;
        MPI_Send(&value, 1, MPI_INT, runtime.world_size(), 0, MPI_COMM_WORLD);  // no such rank
        throw std::runtime_error("collective_faults world_error: MPI_Send returned");
      }
      group.cpu().barrier();  // rank 0 never comes
      return;
    }
    if (mode == "mpi_error") {
      try {
        DDP_MPI_CHECK(MPI_ERR_TRUNCATE);
      } catch (const std::runtime_error& e) {
        if (runtime.is_main()) std::printf("%s\n", e.what());
      }
      return;
    }
    // "signal": a communicator of its own, with a short stop grace and a long timeout, so only
    // the stop grace can end the wait.
    std::unique_ptr<ddp::Communicator> own;
    if (mode == "ring") {
      ddp::CpuOptions options = ddp::cpu_options_from_environment(runtime, std::chrono::seconds(0));
      options.sockets = ddp::CpuOptions::Sockets::Always;
      options.socket_bytes = 0;
      own = ddp::make_cpu_communicator(ddp::detail::RuntimeInternals::comm(runtime), options);
    }
    if (mode == "signal") {
      ddp::MpiOptions options;
      options.timeout = std::chrono::seconds(600);
      options.stop_grace = std::chrono::seconds(2);
      options.on_fatal_error = [&](const std::string& message) { runtime.abort(message); };
      own = std::make_unique<ddp::MpiCommunicator>(ddp::detail::RuntimeInternals::comm(runtime),
                                                   options);
    }
    ddp::StopSignalHandlers stop_handlers;
    ddp::Communicator& comm = own ? *own : group.cpu();
    const int rank = comm.rank(), size = comm.size();
    // #1 and #2 below are the same on every rank, except in "mismatch".
    torch::Tensor ones = torch::ones({4});
    comm.all_reduce(ones);
    if (ones[0].item<float>() != static_cast<float>(size)) throw std::runtime_error("wrong sum");
    if (mode == "mismatch") {
      if (rank == 1) {
        comm.broadcast(torch::zeros({3}, torch::kLong));
      } else {
        comm.all_reduce(torch::zeros({10}));
      }
      throw std::runtime_error("collective_faults mismatch: the mismatch went unnoticed");
    }
    comm.barrier();
    if ((mode == "stop" || mode == "ring") && rank == size - 1) std::raise(SIGSTOP);
    if ((mode == "idle" || mode == "signal") && rank == 1) {
      std::this_thread::sleep_for(std::chrono::seconds(60));
    }
    std::thread signaller;
    if (mode == "signal" && rank == 0) {
      signaller = std::thread([] {  // while rank 0 waits in #3
        std::this_thread::sleep_for(std::chrono::milliseconds(500));
        std::raise(SIGTERM);
      });
      signaller.detach();
    }
    torch::Tensor stats = torch::tensor({1.0, static_cast<double>(rank), 3.0}, torch::kDouble);
    comm.all_reduce(stats, ddp::ReduceOp::Max);  // #3
    if (mode == "stop" || mode == "idle" || mode == "signal" || mode == "ring") {
      throw std::runtime_error("collective_faults " + mode + ": the watchdog never fired");
    }
    // "agree": the other kinds, and an all-reduce large enough for the blocking path.
    torch::Tensor root = torch::arange(3, torch::kLong) * (rank == 0 ? 1 : 0);
    comm.broadcast(root);
    torch::Tensor gathered = comm.all_gather(torch::full({2, 2}, rank, torch::kInt));
    torch::Tensor large = torch::ones({1 << 20});
    comm.all_reduce_async(large, ddp::ReduceOp::Avg)->wait();
    if (root[2].item<int64_t>() != 2 || gathered[size - 1][1][1].item<int>() != size - 1 ||
        large[12345].item<float>() != 1.0f || stats[1].item<double>() != size - 1) {
      throw std::runtime_error("collective_faults agree: a result is wrong");
    }
    comm.barrier();
    if (runtime.is_main()) {
      std::printf(
          "collective_faults: every rank called the same 7 collectives, results checked: "
          "OK\n");
    }
  });
}
