#include "comm/replica_communicator.h"

#include "comm/collective.h"

#include <torch/torch.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace ddp {

namespace {

using detail::Collective;
using detail::kind_name;
using Kind = detail::CollectiveKind;

// The replicas of a process meet in memory: CPU tensors of any dtype.
detail::Rules replica_rules() {
  detail::Rules rules;
  rules.prefix = "replica communicator: ";
  rules.device = torch::Device(torch::kCPU);
  rules.device_reason =
      "the replicas of a process reduce CPU tensors in memory (GPUs use one NCCL communicator "
      "per device)";
  return rules;
}

// One collective of a channel, from the first replica's arrival until every replica has its
// result.
struct Op {
  Kind kind;
  ReduceOp reduce = ReduceOp::Sum;
  int root = 0;
  uint64_t sequence = 0;
  std::vector<torch::Tensor> inputs;  // one per replica, in replica order
  std::vector<char> here;             // per replica: arrived (a barrier's tensor is undefined)
  int arrived = 0;
  bool ready = false;  // all-reduce: combined in memory and handed to the process communicator
  bool done = false;   // blocking collectives: the result is final (or `error` is set)
  torch::Tensor result;
  std::unique_ptr<Work> process_work;  // all-reduce across the processes, in flight
  std::once_flag finish_once;          // the first replica to wait finishes it for all
  bool finished = false;
  std::exception_ptr error;
  int collected = 0;  // replicas that took their result
};

struct Channel {
  Channel(int replicas, std::unique_ptr<Communicator> process_comm)
      : process(std::move(process_comm)), next_op(static_cast<size_t>(replicas), 0) {}
  std::unique_ptr<Communicator> process;  // null with one process
  std::map<uint64_t, std::shared_ptr<Op>> ops;
  std::vector<uint64_t> next_op;  // per replica
};

}  // namespace

struct ReplicaHub::State {
  std::chrono::seconds timeout{0};  // for the replicas to meet; 0: none (constant)
  std::mutex mutex;  // everything below but `creation`
  std::condition_variable changed;
  bool aborted = false;
  std::string reason;
  std::vector<std::shared_ptr<Channel>> channels;
  std::vector<size_t> next_channel;  // per replica
  // Serialises channel creation, which may be collective over the processes, without holding
  // `mutex`: another replica thread must still be able to arrive at a collective meanwhile.
  std::mutex creation;

  void throw_if_aborted() const {
    if (aborted) throw ReplicasAborted(reason);
  }
};

namespace {

class ReplicaWork;

class ReplicaCommunicator final : public Communicator {
 public:
  ReplicaCommunicator(std::shared_ptr<ReplicaHub::State> state, std::shared_ptr<Channel> channel,
                      int replica, int replicas, int process_rank, int processes)
      : state_(std::move(state)),
        channel_(std::move(channel)),
        replica_(replica),
        replicas_(replicas),
        rank_(process_rank * replicas + replica),
        size_(processes * replicas),
        rules_(replica_rules()) {}

  std::string backend() const override {
    return channel_->process ? "in-process+" + channel_->process->backend() : "in-process";
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  std::unique_ptr<Work> all_reduce_async(const torch::Tensor& tensor, ReduceOp op) override;
  void broadcast(const torch::Tensor& tensor, int root) override;
  torch::Tensor all_gather(const torch::Tensor& tensor) override;
  void barrier() override;

 private:
  friend class ReplicaWork;
  // Registers this replica's tensor with its next collective; true when it is the last to come.
  std::pair<std::shared_ptr<Op>, bool> arrive(std::unique_lock<std::mutex>& lock, Kind kind,
                                              const torch::Tensor& tensor, ReduceOp reduce,
                                              int root);
  void combine(Op& op) const;
  // Waits under `lock` until `ready()` or the hub is aborted. With a timeout, a wait that is
  // still short of replicas `timeout` after this replica came aborts the hub and throws,
  // naming the collective and the replicas that never came; once all have come, the op is in
  // the process communicator, whose own watchdog covers it, and the wait goes on.
  void wait_for_replicas(std::unique_lock<std::mutex>& lock, const Op& op,
                         const std::function<bool()>& ready) const;
  // Blocking collectives: the last replica runs `run` (outside the lock), the others wait.
  std::shared_ptr<Op> run_blocking(Kind kind, const torch::Tensor& tensor, int root,
                                   const std::function<void(Op&)>& run);
  void collect(const std::shared_ptr<Op>& op);

  std::shared_ptr<ReplicaHub::State> state_;
  std::shared_ptr<Channel> channel_;
  int replica_, replicas_, rank_, size_;
  detail::Rules rules_;
};

class ReplicaWork final : public Work {
 public:
  ReplicaWork(ReplicaCommunicator& comm, std::shared_ptr<Op> op, torch::Tensor tensor)
      : comm_(comm), op_(std::move(op)), tensor_(std::move(tensor)) {}

  void wait() override {
    if (waited_) {
      if (op_->error) std::rethrow_exception(op_->error);
      return;
    }
    auto& state = *comm_.state_;
    {
      std::unique_lock<std::mutex> lock(state.mutex);
      comm_.wait_for_replicas(lock, *op_, [&] { return op_->ready; });
      if (!op_->ready) throw ReplicasAborted(state.reason);
    }
    Op& op = *op_;
    const int size = comm_.size_;
    std::call_once(op.finish_once, [&op, size] {
      if (op.error) return;  // combining already failed
      try {
        if (op.process_work) op.process_work->wait();
        detail::finish_avg(op.result, op.reduce, size);
      } catch (...) {
        op.error = std::current_exception();
      }
      op.finished = true;
    });
    waited_ = true;
    if (!op.error) {
      torch::NoGradGuard no_grad;
      tensor_.copy_(op.result);
    }
    comm_.collect(op_);
    if (op.error) std::rethrow_exception(op.error);
  }

  std::exception_ptr error() const override { return waited_ ? op_->error : nullptr; }

  std::optional<Span> host_span() const override {
    if (!waited_ || !op_->process_work) return std::nullopt;
    return op_->process_work->host_span();
  }

 private:
  ReplicaCommunicator& comm_;
  std::shared_ptr<Op> op_;
  torch::Tensor tensor_;
  bool waited_ = false;
};

std::pair<std::shared_ptr<Op>, bool> ReplicaCommunicator::arrive(
    std::unique_lock<std::mutex>& lock, Kind kind, const torch::Tensor& tensor, ReduceOp reduce,
    int root) {
  (void)lock;  // held by the caller
  state_->throw_if_aborted();
  const uint64_t sequence = channel_->next_op[static_cast<size_t>(replica_)]++;
  std::shared_ptr<Op>& slot = channel_->ops[sequence];
  if (!slot) {
    slot = std::make_shared<Op>();
    slot->kind = kind;
    slot->reduce = reduce;
    slot->root = root;
    slot->sequence = sequence;
    slot->inputs.resize(static_cast<size_t>(replicas_));
    slot->here.assign(static_cast<size_t>(replicas_), 0);
  } else if (slot->kind != kind || slot->reduce != reduce || slot->root != root) {
    // Replicas that disagree would exchange the wrong tensors: stop them all, saying where.
    const std::string reason =
        "replica communicator: collective #" + std::to_string(sequence) + " is " +
        kind_name(kind) + " on replica " + std::to_string(rank_) + " but " +
        kind_name(slot->kind) + " (or another op or root) on another replica of the process: "
        "every replica must issue the same collectives in the same order";
    state_->aborted = true;
    state_->reason = reason;
    state_->changed.notify_all();
    throw std::logic_error(reason);
  }
  slot->inputs[static_cast<size_t>(replica_)] = tensor;
  slot->here[static_cast<size_t>(replica_)] = 1;
  const bool last = ++slot->arrived == replicas_;
  return {slot, last};
}

void ReplicaCommunicator::combine(Op& op) const {
  // In replica order, whichever thread runs it: the sum is the same bits every time.
  torch::NoGradGuard no_grad;
  torch::Tensor acc = op.inputs[0].clone();
  for (size_t r = 1; r < op.inputs.size(); ++r) {
    const torch::Tensor& x = op.inputs[r];
    switch (op.reduce) {
      case ReduceOp::Sum:
      case ReduceOp::Avg: acc.add_(x); break;
      case ReduceOp::Min: acc = torch::minimum(acc, x); break;
      case ReduceOp::Max: acc = torch::maximum(acc, x); break;
    }
  }
  op.result = acc;
}

std::unique_ptr<Work> ReplicaCommunicator::all_reduce_async(const torch::Tensor& tensor,
                                                            ReduceOp reduce) {
  (void)Collective::all_reduce(rules_, tensor, reduce);
  std::unique_lock<std::mutex> lock(state_->mutex);
  auto [op, last] = arrive(lock, Kind::AllReduce, tensor, reduce, 0);
  if (last) {
    // Under the lock: the all-reduces of a channel reach the process communicator in their
    // order, which is the same in every process.
    try {
      combine(*op);
      if (channel_->process) {
        op->process_work =
            channel_->process->all_reduce_async(op->result, detail::without_avg(reduce));
      }
    } catch (...) {
      op->error = std::current_exception();
    }
    op->ready = true;
    op->inputs.clear();  // the tensors belong to the replicas again once they wait
    state_->changed.notify_all();
  }
  return std::make_unique<ReplicaWork>(*this, op, tensor);
}

std::shared_ptr<Op> ReplicaCommunicator::run_blocking(Kind kind, const torch::Tensor& tensor,
                                                      int root,
                                                      const std::function<void(Op&)>& run) {
  std::unique_lock<std::mutex> lock(state_->mutex);
  const auto arrival = arrive(lock, kind, tensor, ReduceOp::Sum, root);
  const std::shared_ptr<Op> op = arrival.first;  // named: lambdas below capture it
  if (arrival.second) {
    // Every replica of the process is here, waiting: nothing else can use the channel until
    // this returns, so the process collective runs without the lock.
    lock.unlock();
    try {
      torch::NoGradGuard no_grad;
      run(*op);
    } catch (...) {
      op->error = std::current_exception();
    }
    lock.lock();
    op->done = true;
    state_->changed.notify_all();
  } else {
    wait_for_replicas(lock, *op, [&] { return op->done; });
    if (!op->done) throw ReplicasAborted(state_->reason);
  }
  return op;
}

void ReplicaCommunicator::wait_for_replicas(std::unique_lock<std::mutex>& lock, const Op& op,
                                            const std::function<bool()>& ready) const {
  ReplicaHub::State& state = *state_;
  const auto done = [&] { return ready() || state.aborted; };
  if (state.timeout.count() <= 0) return state.changed.wait(lock, done);
  if (state.changed.wait_for(lock, state.timeout, done)) return;
  if (op.arrived == replicas_) return state.changed.wait(lock, done);
  std::string missing;
  for (int r = 0; r < replicas_; ++r) {
    if (op.here[static_cast<size_t>(r)]) continue;
    missing += (missing.empty() ? "" : ", ") + std::to_string(r) + " (the job's " +
               std::to_string(rank_ - replica_ + r) + ")";
  }
  const std::string reason =
      "replica communicator: " + std::string(kind_name(op.kind)) + " #" +
      std::to_string(op.sequence) + " unfinished " + std::to_string(state.timeout.count()) +
      " s after this replica entered it (ProcessGroupOptions::timeout): replica(s) " + missing +
      " of this process never came (hung in their own code, or calling another collective)";
  state.aborted = true;  // the other replicas of the process stop waiting too
  state.reason = reason;
  state.changed.notify_all();
  throw std::runtime_error(reason);
}

void ReplicaCommunicator::collect(const std::shared_ptr<Op>& op) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (++op->collected == replicas_) channel_->ops.erase(op->sequence);
}

void ReplicaCommunicator::broadcast(const torch::Tensor& tensor, int root) {
  (void)Collective::broadcast(rules_, tensor, root, size_);
  const int root_process = root / replicas_;
  const int root_replica = root % replicas_;
  Communicator* process = channel_->process.get();
  const int my_process = rank_ / replicas_;
  auto op = run_blocking(Kind::Broadcast, tensor, root, [&](Op& o) {
    torch::Tensor buffer = my_process == root_process
                               ? o.inputs[static_cast<size_t>(root_replica)].clone()
                               : torch::empty_like(o.inputs[0]);
    if (process) process->broadcast(buffer, root_process);
    o.result = buffer;
    o.inputs.clear();
  });
  if (!op->error) {
    torch::NoGradGuard no_grad;
    tensor.copy_(op->result);
  }
  collect(op);
  if (op->error) std::rethrow_exception(op->error);
}

torch::Tensor ReplicaCommunicator::all_gather(const torch::Tensor& tensor) {
  (void)Collective::all_gather(rules_, tensor);
  Communicator* process = channel_->process.get();
  const int replicas = replicas_;
  auto op = run_blocking(Kind::AllGather, tensor, 0, [&](Op& o) {
    torch::Tensor mine = torch::stack(o.inputs);  // [replicas, ...]: this process's rows
    o.inputs.clear();
    if (process) {
      torch::Tensor all = process->all_gather(mine);  // [processes, replicas, ...]
      std::vector<int64_t> shape{all.size(0) * replicas};
      shape.insert(shape.end(), tensor.sizes().begin(), tensor.sizes().end());
      mine = all.reshape(shape);
    }
    o.result = mine;
  });
  torch::Tensor result = op->error ? torch::Tensor() : op->result.clone();
  collect(op);
  if (op->error) std::rethrow_exception(op->error);
  return result;
}

void ReplicaCommunicator::barrier() {
  Communicator* process = channel_->process.get();
  auto op = run_blocking(Kind::Barrier, torch::Tensor(), 0, [&](Op& o) {
    o.inputs.clear();
    if (process) process->barrier();
  });
  collect(op);
  if (op->error) std::rethrow_exception(op->error);
}

}  // namespace

ReplicaHub::ReplicaHub(int replicas, int process_rank, int processes,
                       ProcessCommFactory make_process_comm, std::chrono::seconds timeout)
    : replicas_(replicas),
      process_rank_(process_rank),
      processes_(processes),
      make_process_comm_(std::move(make_process_comm)),
      state_(std::make_shared<State>()) {
  if (replicas < 1) {
    throw std::invalid_argument("ReplicaHub: replicas must be >= 1 (got " + std::to_string(replicas) + ")");
  }
  if (processes < 1 || process_rank < 0 || process_rank >= processes) {
    throw std::invalid_argument("ReplicaHub: process rank " + std::to_string(process_rank) +
                                " of " + std::to_string(processes) + " processes");
  }
  if (processes > 1 && !make_process_comm_) {
    throw std::invalid_argument("ReplicaHub: " + std::to_string(processes) +
                                " processes but no communicator factory to reach them");
  }
  state_->next_channel.assign(static_cast<size_t>(replicas), 0);
  state_->timeout = timeout;
}

ReplicaHub::~ReplicaHub() = default;

std::unique_ptr<Communicator> ReplicaHub::communicator(int replica) {
  if (replica < 0 || replica >= replicas_) {
    throw std::invalid_argument("ReplicaHub::communicator: replica " + std::to_string(replica) +
                                " of " + std::to_string(replicas_));
  }
  std::shared_ptr<Channel> channel;
  {
    std::lock_guard<std::mutex> creating(state_->creation);
    size_t k = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->throw_if_aborted();
      k = state_->next_channel[static_cast<size_t>(replica)]++;
      if (k < state_->channels.size()) channel = state_->channels[k];
    }
    if (!channel) {
      // This replica is the first at channel k; it has had channels 0..k-1, so k is the next.
      std::unique_ptr<Communicator> process = processes_ > 1 ? make_process_comm_() : nullptr;
      std::lock_guard<std::mutex> lock(state_->mutex);
      state_->channels.push_back(std::make_shared<Channel>(replicas_, std::move(process)));
      channel = state_->channels.back();
    }
  }
  return std::make_unique<ReplicaCommunicator>(state_, channel, replica, replicas_, process_rank_,
                                               processes_);
}

void ReplicaHub::abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(state_->mutex);
  if (!state_->aborted) {
    state_->aborted = true;
    state_->reason = reason;
  }
  state_->changed.notify_all();
}

bool ReplicaHub::aborted() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  return state_->aborted;
}

}  // namespace ddp
