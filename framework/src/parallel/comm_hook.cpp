#include <ddp/comm_hook.h>

#include <torch/torch.h>

#include <map>
#include <memory>
#include <stdexcept>
#include <unordered_set>
#include <utility>

namespace ddp {

BucketFuture::BucketFuture(std::unique_ptr<Work> work, torch::Tensor result)
    : work_(std::move(work)), result_(std::move(result)) {}

BucketFuture::BucketFuture(torch::Tensor result) : result_(std::move(result)) {}

BucketFuture BucketFuture::then(std::function<torch::Tensor(torch::Tensor)> next) && {
  next_.push_back(std::move(next));
  return std::move(*this);
}

torch::Tensor BucketFuture::wait() {
  if (!result_.defined()) throw std::logic_error("BucketFuture::wait: called twice");
  if (work_) work_->wait();
  torch::Tensor result = std::move(result_);
  for (auto& next : next_) result = next(std::move(result));
  next_.clear();
  return result;
}

std::optional<Work::Span> BucketFuture::host_span() const {
  return work_ ? work_->host_span() : std::nullopt;
}

CommHook::CommHook(Function function, std::shared_ptr<CommHookState> state, std::string description)
    : function_(std::move(function)),
      state_(std::move(state)),
      description_(std::move(description)) {}

CommHook allreduce_hook() {
  return CommHook(
      [](Communicator& comm, GradBucket& bucket) {
        bucket.buffer.div_(bucket.training_ranks);
        return BucketFuture(comm.all_reduce_async(bucket.buffer, ReduceOp::Sum), bucket.buffer);
      },
      nullptr, "allreduce");
}

namespace {

CommHook compress_hook(torch::ScalarType wire_dtype, const char* description) {
  // One wire tensor per bucket, kept: with NCCL it is in use on another stream until the end of
  // backward, and a tensor allocated per step could be handed out again too early.
  auto wires = std::make_shared<std::map<size_t, torch::Tensor>>();
  auto hook = [wires, wire_dtype](Communicator& comm, GradBucket& bucket) {
    torch::Tensor& wire = (*wires)[bucket.index];
    if (!wire.defined() || wire.numel() != bucket.buffer.numel()) {
      wire = torch::empty({bucket.buffer.numel()}, bucket.buffer.options().dtype(wire_dtype));
    }
    bucket.buffer.div_(bucket.training_ranks);
    wire.copy_(bucket.buffer);
    torch::Tensor buffer = bucket.buffer;
    return BucketFuture(comm.all_reduce_async(wire, ReduceOp::Sum), wire)
        .then([buffer](torch::Tensor reduced) {
          buffer.copy_(reduced);
          return buffer;
        });
  };
  // The wires are scratch memory, overwritten every step: no state to save.
  return CommHook(std::move(hook), nullptr, description);
}

}  // namespace

CommHook fp16_compress_hook() { return compress_hook(torch::kHalf, "fp16"); }

CommHook bf16_compress_hook() { return compress_hook(torch::kBFloat16, "bf16"); }

CommHook noop_hook() {
  return CommHook([](Communicator&, GradBucket& bucket) { return BucketFuture(bucket.buffer); },
                  nullptr, "noop");
}

namespace {

// Steps `optimizer` on `params` only: each param group is cut down to those of its parameters in
// `params` for the one step(), and given back whole afterwards (also when step() throws). The
// state is keyed by parameter, so it is the same state a full step would update.
void step_subset(torch::optim::Optimizer& optimizer, const std::vector<torch::Tensor>& params) {
  std::unordered_set<const c10::TensorImpl*> wanted;
  for (const auto& p : params) wanted.insert(p.unsafeGetTensorImpl());
  auto& groups = optimizer.param_groups();
  std::vector<std::vector<torch::Tensor>> whole(groups.size());
  struct GiveBack {
    std::vector<torch::optim::OptimizerParamGroup>& groups;
    std::vector<std::vector<torch::Tensor>>& whole;
    ~GiveBack() {
      for (size_t g = 0; g < groups.size(); ++g) groups[g].params() = std::move(whole[g]);
    }
  } give_back{groups, whole};
  for (size_t g = 0; g < groups.size(); ++g) {
    whole[g] = std::move(groups[g].params());
    groups[g].params().clear();
    for (const auto& p : whole[g]) {
      if (wanted.count(p.unsafeGetTensorImpl())) groups[g].params().push_back(p);
    }
  }
  optimizer.step();
}

}  // namespace

CommHook hook_then_optimizer(CommHook inner, torch::optim::Optimizer& optimizer) {
  if (!inner) throw std::invalid_argument("hook_then_optimizer: the inner hook is empty");
  if (inner.steps_optimizer()) {
    throw std::invalid_argument("hook_then_optimizer: the inner hook steps an optimizer already");
  }
  torch::optim::Optimizer* stepped = &optimizer;
  CommHook::Function function = [inner, stepped](Communicator& comm, GradBucket& bucket) {
    std::vector<torch::Tensor> params = bucket.parameters;
    return inner(comm, bucket).then([params = std::move(params), stepped](torch::Tensor average) {
      // The averages into grad() (the reducer copies them there again: the same values), then
      // the step of these parameters.
      torch::NoGradGuard no_grad;
      int64_t offset = 0;
      for (torch::Tensor p : params) {
        torch::Tensor mine = average.narrow(0, offset, p.numel()).view(p.sizes());
        offset += p.numel();
        torch::Tensor& grad = p.mutable_grad();
        if (!grad.defined()) {
          grad = mine.clone();
        } else if (!grad.is_same(mine)) {
          grad.copy_(mine);
        }
      }
      step_subset(*stepped, params);
      return average;
    });
  };
  CommHook composed(std::move(function), inner.state(), inner.description());
  composed.steps_optimizer_ = stepped;
  return composed;
}

}  // namespace ddp
