#pragma once
// Communicator::all_reduce_after_fill's contract, on any communicator: `fill` runs after the
// all-reduce issued before it has finished (it waits for that sum and uses it), and the tensor it
// writes is summed as any other. The host backends (`on_worker`) run it on their worker, after
// the call has returned: it never holds up the caller. The base class runs it at the call, on the
// caller's thread.
#include <ddp/communicator.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <future>
#include <memory>
#include <string>
#include <thread>

namespace ddp_test {

// `first_n` elements in the first all-reduce (default: n), so that on a size-routed communicator
// the two can take different paths (PowerSGD's small Ps on MPI, its large Qs on the ring).
inline void check_all_reduce_after_fill(ddp::Communicator& comm, int64_t n, bool on_worker,
                                        const std::string& what, int64_t first_n = 0) {
  const int r = comm.rank(), w = comm.size();
  const torch::Tensor first = torch::full({first_n > 0 ? first_n : n}, double(r + 1));
  std::shared_ptr<ddp::Work> first_sum = comm.all_reduce_async(first);
  const torch::Tensor second = torch::zeros({n});
  std::promise<void> returned;
  std::shared_future<void> has_returned = returned.get_future().share();
  std::thread::id filled_on;
  bool after_return = false;
  auto work = comm.all_reduce_after_fill(second, [&, on_worker] {
    filled_on = std::this_thread::get_id();
    // Run at the call, this would wait its 10 s and fail below; it cannot hang.
    if (on_worker) {
      after_return = has_returned.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
    }
    first_sum->wait();
    second.fill_(first[0] * (r + 1));  // this rank's share of the second sum needs the first's
  });
  returned.set_value();
  work->wait();
  if (on_worker) {
    EXPECT_NE(filled_on, std::this_thread::get_id()) << what << ": filled on the caller's thread";
    EXPECT_TRUE(after_return) << what << ": the call waited for its fill";
  } else {
    EXPECT_EQ(filled_on, std::this_thread::get_id()) << what;
  }
  const double sum = w * (w + 1) / 2.0;  // of the first, and of the factors r + 1
  EXPECT_TRUE(torch::equal(second, torch::full({n}, sum * sum))) << what;
}

}  // namespace ddp_test
