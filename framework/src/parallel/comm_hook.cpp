#include <ddp/comm_hook.h>

#include <torch/torch.h>

#include <map>
#include <stdexcept>
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
    : function_(std::move(function)), state_(std::move(state)), description_(std::move(description)) {}

CommHook allreduce_hook() {
  return CommHook(
      [](Communicator& comm, GradBucket& bucket) {
        bucket.buffer.div_(comm.size());
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
    bucket.buffer.div_(comm.size());
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

}  // namespace ddp
