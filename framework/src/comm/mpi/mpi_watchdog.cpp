#include "comm/mpi/mpi_watchdog.h"

#include "util/mpi_check.h"

#include <ddp/stop_signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace ddp::detail {

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kPoll = std::chrono::milliseconds(100);

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (size_t i = 0; i < parts.size(); ++i) text += (i ? ", " : "") + parts[i];
  return text;
}

}  // namespace

MpiWatchdog::MpiWatchdog(WatchdogOptions options, std::function<WorkerState()> state,
                         std::shared_ptr<Inquiry> inquiry, int member)
    : options_(std::move(options)),
      state_(std::move(state)),
      inquiry_(std::move(inquiry)),
      member_(member) {
  thread_ = std::thread([this] { loop(); });
}

MpiWatchdog::~MpiWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void MpiWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!wake_.wait_for(lock, kPoll, [this] { return stopping_; })) {
    lock.unlock();
    // No MPI call here in normal operation (comm/mpi/inquiry.h says why).
    const WorkerState state = state_();
    if (state.in_collective) {
      const auto now = Clock::now();
      if (now - state.entered > options_.timeout) timed_out(state, /*after_stop=*/false);
      // A stop signal that arrived while this collective was running (so less time ago than
      // the worker entered it), stop_grace ago or longer (see the header).
      const double since_stop = seconds_since_stop_signal();
      const double in_it = std::chrono::duration<double>(now - state.entered).count();
      const auto grace = static_cast<double>(options_.stop_grace.count());
      if (grace > 0 && since_stop > grace && since_stop < in_it)
        timed_out(state, /*after_stop=*/true);
    }
    lock.lock();
  }
}

void MpiWatchdog::timed_out(const WorkerState& state, bool after_stop) {
  const auto answer_wait = std::min<Clock::duration>(Inquiry::kAnswerWait, options_.timeout);
  const std::vector<RankReport> reports =
      inquiry_->ask(std::chrono::duration_cast<std::chrono::milliseconds>(answer_wait));
  const std::string seconds =
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(answer_wait).count());
  const int rank = inquiry_->rank();
  const Collective::Fingerprint mine = state.call->fingerprint();
  std::vector<std::string> never_arrived, waiting, elsewhere;
  for (int r = 0; r < static_cast<int>(reports.size()); ++r) {
    if (r == rank) continue;
    const std::string who = "rank " + std::to_string(r);
    if (!reports[r].answered) {
      never_arrived.push_back(who + " (no answer within " + seconds +
                              " s: stopped, dead, or its process hangs; or alive but in no "
                              "collective: its program is elsewhere)");
      continue;
    }
    if (reports[r].in(member_, mine)) {
      waiting.push_back(std::to_string(r));
    } else if (reports[r].calls.empty()) {
      never_arrived.push_back(who + " (alive, in no collective: its program is elsewhere)");
    } else {
      elsewhere.push_back(who + " is in " + describe_calls(*inquiry_, reports[r]));
    }
  }
  const std::string why =
      after_stop
          ? " unfinished " + std::to_string(options_.stop_grace.count()) + " s after " +
                stop_signal_name(stop_signal()) + " arrived while rank " + std::to_string(rank) +
                " was in it, so no rank can reach the step boundary where it would stop "
                "(MpiOptions::stop_grace). Ranks that never arrived: "
          : " unfinished " + std::to_string(options_.timeout.count()) + " s after rank " +
                std::to_string(rank) +
                " entered it (MpiOptions::timeout: --timeout, DDP_TIMEOUT_SECONDS). Ranks that "
                "never arrived: ";
  std::string message = "MPI watchdog on rank " + std::to_string(rank) + ": " +
                        state.call->describe() + " on " + inquiry_->name(member_) + why +
                        (never_arrived.empty() ? std::string("none") : join(never_arrived));
  if (!waiting.empty()) message += "; waiting in it too: rank(s) " + join(waiting);
  if (!elsewhere.empty()) {
    message +=
        ". The ranks call different collectives: " + join(elsewhere) + ". " + mismatch_cause();
  } else if (never_arrived.empty()) {
    message +=
        " (every rank is in it: the transfer itself hangs, e.g. a rank stopped in the "
        "middle of it, or the network)";
  }
  message += ". Ending the job.";
  if (options_.on_fatal_error) options_.on_fatal_error(message);
  std::fprintf(stderr, "ddp: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace ddp::detail
