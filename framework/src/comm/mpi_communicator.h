#pragma once
// Communicator backend over MPI, for CPU tensors (tensors on a GPU are staged through host
// memory: correct, not fast). As c10d's ProcessGroupMPI does, it owns a worker thread that makes
// every blocking MPI call of this communicator, in the order the calls were made: an
// all_reduce_async() returns at once and the worker reduces while the caller computes, and the
// blocking collectives queue behind it and wait.
//
// It owns a duplicate of the communicator it is given, so its messages never match the
// application's own MPI traffic, nor another MpiCommunicator's (each worker thread then has a
// communicator of its own, which MPI needs for concurrent collectives).
//
// Needs MPI_THREAD_MULTIPLE (the worker and the caller's other MPI calls run at once); the
// constructor throws std::runtime_error saying so when MPI provides less.
//
// Errors: a failing MPI call becomes an exception that Work::wait() rethrows on the caller's
// thread, with MPI's message, the call and file:line (mpi_check.h).
//
// Waiting: every collective is a non-blocking MPI call (MPI_Iallreduce, ...) that the worker
// tests. For the first MpiOptions::spin of a wait it tests without pause (what a blocking call
// does, so a collective whose peers are there costs the same); after that it sleeps between
// tests, 20 us at first, doubling up to MpiOptions::max_sleep: a rank waiting for a peer that
// is late, stopped or dead no longer burns a core. An all-reduce of at least
// MpiOptions::blocking_bytes first waits that way in an MPI_Ibarrier (everyone has arrived),
// then makes the blocking MPI_Allreduce: Open MPI's blocking all-reduce uses faster algorithms
// for large messages than its non-blocking one, and sleeping while bytes move over TCP stalls
// them (docs/performance.md). Limit: a rank stopped after every rank arrived at such a large
// all-reduce (in the middle of the transfer) leaves the others spinning in it until the timeout.
//
// Watchdog: a second thread per communicator (asleep, waking every 100 ms, no MPI call) ends the job when a
// collective is still unfinished MpiOptions::timeout after this rank's worker entered it: it
// calls MpiOptions::on_fatal_error (ProcessGroup passes Runtime::abort) with a message naming
// the collective, its sequence number on this communicator (1 for the first call, counting
// every kind), its dtype and shape, this rank, and the ranks that never arrived. To know those,
// the timed-out rank asks every other rank over a private duplicate of the communicator and
// waits 2 s; ranks whose watchdogs have fired too answer with their worker's state. Limits,
// honestly: only ranks waiting past the timeout themselves answer, so the ranks named "no
// answer" are those stopped, dead, hung, or alive but not in this collective (an idle rank
// cannot be told from a stopped one: the watchdog makes no MPI call in normal operation,
// because Open MPI 4.1.4's shared-memory transport crashed when it polled beside the workers);
// an answering rank in another collective is named with it; the ranks are those of this communicator (ProcessGroup's
// communicators are duplicates of MPI_COMM_WORLD, so these are the world ranks). The timeout
// counts from when this rank entered the collective, not from when it was queued.
//
// Stop signals (ddp/util/stop_signal.h): a program that stops on SIGTERM stops at its next step
// boundary, which a rank stuck in a collective whose peer is dead or hung never reaches (Slurm's
// time limit while a rank hangs; `srun --kill-on-bad-exit`'s SIGTERM to the survivors of a
// crash), and Slurm kills it only KillWait (30 s) later, without a word. So a collective that was already
// running when the stop signal came and is still unfinished MpiOptions::stop_grace after it
// ends the job the same way, the message saying that the signal could not be honoured. The
// collectives of the stop itself (entered after the signal: the agreement, the snapshot) keep
// the full timeout.
//
// Sockets: Open MPI's TCP transport moves bytes only while a thread polls it inside an MPI call,
// so between hosts linked by TCP its all-reduce runs at the speed the polling thread gets a core
// beside training (55-70% of a 100 Mbit/s link in docs/performance.md). So where
// MpiOptions::sockets says, all-reduces of at least MpiOptions::socket_bytes go over a TCP ring
// between the ranks instead (comm/socket_ring.h, made on the worker at the first such call, a
// collective): the worker sleeps in poll() while the kernel moves the bytes. Its result is
// bitwise the same on every rank, but may differ in the last bits from MPI's (another order of
// additions). The other collectives, and the small all-reduces, stay on MPI.
//
// Debug mode (MpiOptions::check_collectives; ProcessGroup sets it from DDP_DEBUG=DETAIL): before
// each collective the ranks all-gather a fingerprint of it (kind, sequence number, dtype, shape,
// reduce op or root). When any rank differs, every rank's Work::wait() throws the same error
// naming both sides, e.g. "rank 0 called all_reduce #12 float32[10] (sum) but rank 1 called
// broadcast #12 int64[3] (root 0)", and no rank runs the collective. It costs one small
// all-gather per collective.

#include <ddp/communicator.h>

#include <mpi.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ddp {

struct MpiOptions {
  // How the worker waits for a collective (see above): busy-testing for `spin`, then sleeping
  // between tests, the sleeps doubling from 20 us up to `max_sleep`. `spin` 0: sleep at once;
  // `max_sleep` 0: never sleep (a core per waiting rank, as a blocking MPI call). ProcessGroup
  // reads DDP_MPI_SPIN_US and DDP_MPI_MAX_SLEEP_US.
  std::chrono::microseconds spin{1000};
  std::chrono::microseconds max_sleep{2000};

  // All-reduces of at least this many bytes wait for every rank in an MPI_Ibarrier, then make
  // the blocking MPI_Allreduce (see above); smaller ones are one MPI_Iallreduce. 0: every
  // all-reduce so. ProcessGroup reads DDP_MPI_BLOCKING_KIB.
  std::size_t blocking_bytes = 64 << 10;

  // The largest message of one MPI_Allreduce: a larger all-reduce is made of consecutive calls
  // on pieces of at most this many bytes (the result is the same, element by element). 0 (the
  // default): one call per tensor (up to INT_MAX elements). Why it exists: Open MPI moved large
  // messages slower per byte than pieces of a few MiB in our measurements, over shared memory
  // (cache) and over TCP (docs/performance.md); the default stays 0 until a quiet-machine
  // benchmark shows pieces help end to end. DDP_MPI_MESSAGE_KIB sets it for ProcessGroup.
  std::size_t max_message_bytes = 0;

  // Where large all-reduces leave MPI for ddp's own TCP ring (the rank's thread sleeps while
  // the kernel moves the bytes; see "Sockets" above): Auto when the ranks span more than one
  // host and no rank has an InfiniBand/RoCE or Slingshot device (where MPI has a faster
  // transport than TCP); Never; Always (on one host too, over loopback). ProcessGroup reads
  // DDP_MPI_SOCKETS=auto|never|always.
  enum class Sockets { Auto, Never, Always };
  Sockets sockets = Sockets::Auto;
  // All-reduces of at least this many bytes take the ring; smaller ones stay on MPI, whose
  // latency is lower. ProcessGroup reads DDP_MPI_SOCKET_KIB.
  std::size_t socket_bytes = 256 << 10;
  // The interface the ring listens on: comma-separated names, the first one this host has
  // wins. Empty: loopback when every rank is on this host, else the first interface that is up
  // with an IPv4 address and is not loopback or a container bridge. ProcessGroup reads
  // DDP_SOCKET_IFNAME (`ddprun --iface` sets it).
  std::string socket_interfaces;

  // A collective unfinished this long after this rank entered it ends the job (the watchdog,
  // above). PyTorch's default, 10 minutes. ProcessGroup: ProcessGroupOptions::timeout, else
  // DDP_TIMEOUT_SECONDS.
  std::chrono::seconds timeout{600};
  // A collective entered before a stop signal and unfinished this long after it ends the job
  // (above). 0: only the timeout. 10 s: inside Slurm's default KillWait of 30 s, and far longer
  // than one collective of a healthy job takes.
  std::chrono::seconds stop_grace{10};
  // Called on the watchdog thread with the message; must not return (end the process or the
  // job). Unset: the message goes to stderr and the process calls std::abort().
  std::function<void(const std::string&)> on_fatal_error;

  // Before each collective, check that every rank calls the same one (the debug mode, above).
  bool check_collectives = false;
};

// MpiOptions::sockets by name: "auto", "never", "always" (DDP_MPI_SOCKETS, benchmark flags);
// any other name throws std::invalid_argument naming `what` and the names.
MpiOptions::Sockets parse_sockets(const std::string& name, const std::string& what);
const char* to_string(MpiOptions::Sockets sockets);

namespace detail {
struct MpiTask;     // one queued collective: its MPI calls, and its state once run
class SocketRing;   // the TCP ring for large all-reduces (src/comm/socket_ring.h)
}

class MpiCommunicator final : public Communicator {
 public:
  // Collective over `comm` (MPI_Comm_dup).
  explicit MpiCommunicator(MPI_Comm comm, MpiOptions options = {});
  // Finishes the queued collectives (still under the watchdog), joins the worker and the
  // watchdog and frees the duplicates.
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string backend() const override { return "mpi"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  // Supported dtypes: float32, float64, int32, int64, uint8, and float16/bfloat16 for Sum and
  // Avg (summed in float per element). Avg: floating point only.
  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor,
                                         ReduceOp op = ReduceOp::Sum) override;
  void broadcast(const torch::Tensor& tensor, int root = 0) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  void barrier() override;

  MPI_Comm comm() const { return comm_; }
  // Whether all-reduces of MpiOptions::socket_bytes or more go over the TCP ring (decided, and
  // agreed by every rank, in the constructor).
  bool uses_socket_ring() const { return use_sockets_; }

 private:
  // What a rank's worker is doing, for the watchdog and for the other ranks' questions.
  struct WorkerState {
    int64_t seq = 0;           // the last collective the worker entered (0: none yet)
    bool in_collective = false;
    int kind = 0;              // detail::CallKind of `seq`
    std::shared_ptr<const detail::MpiTask> task;  // the collective it is in, if any
    std::chrono::steady_clock::time_point entered{};
  };

  std::shared_ptr<detail::MpiTask> submit(std::shared_ptr<detail::MpiTask> task);
  void worker_loop();
  // Waits for `request` as described above (spin, then sleeps).
  void wait_for(MPI_Request& request);
  // The debug mode's check: throws naming both sides when the ranks call different collectives.
  void check_same_call(const detail::MpiTask& task);
  void watchdog_loop();
  // Answers the other ranks' questions about this rank's worker (watchdog thread only).
  void answer_questions();
  // `after_stop`: ended by stop_grace after a stop signal, not by the timeout.
  [[noreturn]] void timed_out(const WorkerState& state, bool after_stop);

  MpiOptions options_;
  bool single_host_ = true;  // every rank of comm_ on this host
  bool use_sockets_ = false;  // the large all-reduces take ring_ (MpiOptions::sockets, agreed)
  std::unique_ptr<detail::SocketRing> ring_;  // worker thread only; made at its first use
  MPI_Comm comm_ = MPI_COMM_NULL;
  MPI_Comm watch_comm_ = MPI_COMM_NULL;  // the watchdogs' questions and answers
  int rank_ = 0;
  int size_ = 1;

  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::shared_ptr<detail::MpiTask>> queue_;  // submitted, not yet started; oldest first
  int64_t submitted_ = 0;  // sequence number of the last collective submitted
  bool stopping_ = false;

  std::mutex state_mutex_;
  WorkerState state_;

  // Watchdog thread only: the posted receive for questions, and the answers being sent.
  MPI_Request question_ = MPI_REQUEST_NULL;
  int64_t question_buffer_ = 0;
  struct Answer {
    MPI_Request request = MPI_REQUEST_NULL;
    int64_t values[3] = {0, 0, 0};
  };
  std::deque<std::unique_ptr<Answer>> answers_;

  std::mutex watch_mutex_;
  std::condition_variable watch_wake_;
  bool watch_stopping_ = false;
  std::thread watchdog_;  // started after the worker, joined after it
  std::thread worker_;
};

}  // namespace ddp
