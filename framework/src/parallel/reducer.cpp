#include "parallel/reducer.h"

#include "comm/agreement.h"
#include <ddp/timeline.h>

#include "parallel/bucketing.h"
#include "parallel/unused_parameters.h"
#include "util/clock.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <cmath>
#include <iostream>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace ddp {

namespace {

constexpr size_t kNoBucket = static_cast<size_t>(-1);

}  // namespace

Reducer::Reducer(Communicator& data, Communicator& control, std::vector<torch::Tensor> params,
                 std::vector<std::string> names, DDPOptions options)
    : data_comm_(data),
      control_comm_(control),
      options_(options),
      params_(std::move(params)),
      names_(std::move(names)),
      training_ranks_(data.size()) {
  // Written so that NaN fails too; infinity is refused as well (it would overflow the byte cap).
  auto positive = [](double mb) { return mb > 0 && std::isfinite(mb); };
  if (!positive(options_.bucket_cap_mb) || !positive(options_.first_bucket_mb)) {
    throw std::invalid_argument(
        "DistributedDataParallel: bucket sizes must be finite and > 0 MiB "
        "(DDPOptions::bucket_cap_mb, DDPOptions::first_bucket_mb; got cap " +
        std::to_string(options_.bucket_cap_mb) + ", first " +
        std::to_string(options_.first_bucket_mb) + ")");
  }
  // Reverse registration order: roughly the order in which backward produces gradients.
  std::vector<size_t> order;
  for (size_t k = params_.size(); k-- > 0;) {
    if (params_[k].requires_grad()) order.push_back(k);
  }
  hook_ = allreduce_hook();
  build_buckets(order);
  check_layout_across_ranks();
  rebuild_pending_ = options_.rebuild_buckets;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (slots_[i].bucket != kNoBucket) attach_hook(i);
  }
}

Reducer::~Reducer() {
  // A Work still in flight (a backward that failed) keeps its tensor alive until the backend
  // is done with it.
  for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
}

void Reducer::attach_hook(size_t param) {
  NodePtr accumulator = torch::autograd::impl::grad_accumulator(params_[param]);
  const uintptr_t key =
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, param](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list& /*inputs*/) {
            on_gradient_ready(param);
            return outputs;
          }));
  hooks_.push_back(Hook{param, std::move(accumulator), key});
}

size_t Reducer::reattach_hooks() {
  std::vector<Hook> current;
  std::vector<size_t> replaced;
  for (auto& hook : hooks_) {
    if (torch::autograd::impl::grad_accumulator(params_[hook.param]) == hook.accumulator) {
      current.push_back(std::move(hook));
    } else {
      hook.accumulator->del_post_hook(hook.key);
      replaced.push_back(hook.param);
    }
  }
  hooks_ = std::move(current);
  for (size_t param : replaced) attach_hook(param);
  return replaced.size();
}

void Reducer::build_buckets(const std::vector<size_t>& order) {
  std::vector<ParameterSize> sizes;
  for (const torch::Tensor& p : params_) {
    sizes.push_back({static_cast<size_t>(p.numel()) * p.element_size(), p.scalar_type()});
  }
  const double mib = 1024.0 * 1024.0;
  const BucketCaps caps{options_.first_bucket_mb * mib, options_.bucket_cap_mb * mib};
  buckets_.clear();
  slots_.assign(params_.size(), Slot{kNoBucket, 0, false, {}});
  for (std::vector<size_t>& members : assign_buckets(sizes, order, caps)) {
    Bucket bucket;
    int64_t numel = 0;
    for (size_t i : members) {
      slots_[i] = Slot{buckets_.size(), numel, false, {}};
      numel += params_[i].numel();
    }
    const torch::Tensor& first = params_[members.front()];
    bucket.data = torch::zeros({numel}, first.options().requires_grad(false));
    for (size_t i : members) {
      // detach(): a plain alias, not an autograd view, which zero_grad()'s detach_() would refuse
      // as a grad().
      Slot& slot = slots_[i];
      slot.view =
          bucket.data.narrow(0, slot.offset, params_[i].numel()).view(params_[i].sizes()).detach();
    }
    bucket.pending = members.size();
    bucket.params = std::move(members);
    buckets_.push_back(std::move(bucket));
  }
  if (!options_.gradient_as_bucket_view) return;
  // Gradients already there (a model trained before, or the rebuild's old buckets) move into the
  // new buckets with their values.
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor& grad = params_[i].mutable_grad();
    if (slots_[i].bucket == kNoBucket || !grad.defined() || grad_is_view(i)) continue;
    slots_[i].view.copy_(grad);
    grad = slots_[i].view;
  }
}

void Reducer::set_comm_hook(CommHook hook) {
  if (synced_once_) {
    throw std::logic_error(
        "DistributedDataParallel::register_comm_hook: called after the first "
        "synchronised backward pass; register the hook before training");
  }
  hook_ = std::move(hook);
}

void Reducer::rebuild_buckets() {
  std::vector<int64_t> order(ready_order_.begin(), ready_order_.end());
  std::vector<bool> seen(params_.size(), false);
  for (size_t k : ready_order_) seen[k] = true;
  for (size_t k = params_.size(); k-- > 0;) {
    if (slots_[k].bucket != kNoBucket && !seen[k]) order.push_back(static_cast<int64_t>(k));
  }
  // Every rank has the same parameters, so the same length; rank 0's order wins.
  torch::Tensor shared = torch::tensor(order, torch::kLong);
  control_comm_.broadcast(shared, 0);
  const std::vector<size_t> agreed(shared.data_ptr<int64_t>(),
                                   shared.data_ptr<int64_t>() + shared.numel());
  // With NCCL the GPU may still be all-reducing the old buckets: the caching allocator keeps
  // their memory until the NCCL stream is done with it (NcclCommunicator records that stream).
  build_buckets(agreed);
  check_layout_across_ranks();
  rebuild_pending_ = false;
  ready_order_.clear();
  rebuilt_order_ = agreed;
}

void Reducer::restore_order(const std::vector<size_t>& order) {
  // Bucketed so already: a wrapper that trained on since the snapshot (the same on every rank,
  // whose orders are rank 0's).
  if (!rebuild_pending_ && order == rebuilt_order_) return;
  if (synced_once_) {
    throw std::logic_error(
        "DistributedDataParallel::load_state: after the first synchronised "
        "backward pass; load the state before training");
  }
  std::vector<bool> listed(params_.size(), false);
  for (size_t k : order) {
    if (k >= params_.size() || slots_[k].bucket == kNoBucket || listed[k]) {
      throw std::invalid_argument(
          "DistributedDataParallel::load_state: the saved bucket order "
          "does not fit this model's parameters");
    }
    listed[k] = true;
  }
  for (size_t k = 0; k < params_.size(); ++k) {
    if (slots_[k].bucket != kNoBucket && !listed[k]) {
      throw std::invalid_argument(
          "DistributedDataParallel::load_state: the saved bucket order "
          "lacks parameter " +
          names_[k]);
    }
  }
  build_buckets(order);
  check_layout_across_ranks();
  rebuild_pending_ = false;
  rebuilt_order_ = order;
}

void Reducer::check_layout_across_ranks() {
  std::ostringstream layout;
  layout << "backend " << data_comm_.backend() << ", " << buckets_.size() << " buckets:";
  for (const Bucket& b : buckets_)
    layout << " " << b.data.scalar_type() << "[" << b.data.numel() << "]";
  require_agreement(control_comm_, "DistributedDataParallel: the bucket layout", layout.str(),
                    "Ranks would issue different collectives (bucket layouts differ): use the "
                    "same DDPOptions on every rank");
}

std::vector<std::vector<size_t>> Reducer::bucket_layout() const {
  std::vector<std::vector<size_t>> layout;
  for (const Bucket& b : buckets_) layout.push_back(b.params);
  return layout;
}

bool Reducer::grad_is_view(size_t param) const {
  const torch::Tensor& grad = params_[param].grad();
  const torch::Tensor& view = slots_[param].view;
  return grad.defined() && grad.is_alias_of(view) && grad.data_ptr() == view.data_ptr() &&
         grad.sizes() == view.sizes() && grad.strides() == view.strides();
}

bool Reducer::backward_syncs() {
  if (!forward_sync_ || *forward_sync_ == sync_enabled_) return sync_enabled_;
  if (!warned_guard_after_forward_) {
    warned_guard_after_forward_ = true;
    std::cerr << "ddp: warning: DistributedDataParallel::Join: a backward ran "
              << (sync_enabled_ ? "outside" : "inside") << " no_sync() after a forward "
              << (sync_enabled_ ? "inside" : "outside")
              << " it; under join() the forward decides, as in PyTorch, so these backward passes "
              << (*forward_sync_ ? "synchronise" : "accumulate locally")
              << ". Take the guard before the forward: { auto guard = model.no_sync(); "
                 "loss_fn(model(x), y).backward(); }"
              << std::endl;
  }
  return *forward_sync_;
}

void Reducer::on_gradient_ready(size_t param) {
  if (!backward_syncs()) return;  // no_sync(): accumulate locally
  if (!in_backward_) begin_backward();
  Slot& slot = slots_[param];
  if (slot.ready) {
    throw std::runtime_error("DistributedDataParallel: the gradient of '" + names_[param] +
                             "' arrived twice in one backward pass (reentrant or double "
                             "backward is not supported)");
  }
  torch::Tensor& grad = params_[param].mutable_grad();
  if (grad.is_sparse()) {
    throw std::runtime_error("DistributedDataParallel: '" + names_[param] +
                             "' has a sparse gradient, which is not supported");
  }
  // With gradient_as_bucket_view the gradient is usually in its bucket already.
  if (!grad_is_view(param)) {
    slot.view.copy_(grad);
    if (options_.gradient_as_bucket_view) grad = slot.view;
  }
  slot.ready = true;
  if (rebuild_pending_) ready_order_.push_back(param);
  if (--buckets_[slot.bucket].pending == 0) launch_ready_buckets();
}

void Reducer::start_pass() {
  in_backward_ = true;
  synced_once_ = true;
  next_to_launch_ = 0;
  for (Slot& slot : slots_) slot.ready = false;
  for (Bucket& bucket : buckets_) bucket.pending = bucket.params.size();
  ready_order_.clear();  // a backward that failed before step 5 may have left a partial order
}

void Reducer::begin_backward() {
  start_pass();
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void Reducer::shadow_backward() {
  if (in_backward_)
    throw std::logic_error("DistributedDataParallel: shadowing a step inside backward");
  start_pass();
  finish_backward(/*shadow=*/true);
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same collectives in the same order.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    const size_t b = next_to_launch_++;
    Bucket& bucket = buckets_[b];
    GradBucket view{b, b + 1 == buckets_.size(), bucket.data, {}, {}, training_ranks_};
    for (size_t i : bucket.params) {
      view.gradients.push_back(slots_[i].view);
      view.parameters.push_back(params_[i]);
    }
    bucket.future.emplace(hook_(data_comm_, view));
    if (options_.timeline) {
      options_.timeline->instant("queue bucket " + std::to_string(b), "sync", Clock::now());
    }
  }
}

void Reducer::wait_for_buckets() {
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    BucketFuture future = std::move(*bucket.future);
    bucket.future.reset();
    const torch::Tensor result = future.wait();
    const auto span = future.host_span();
    if (!result.is_same(bucket.data)) {
      if (result.numel() != bucket.data.numel() ||
          result.scalar_type() != bucket.data.scalar_type()) {
        throw std::runtime_error("DistributedDataParallel: the comm hook's result for bucket " +
                                 std::to_string(b) + " has " + std::to_string(result.numel()) +
                                 " elements of " +
                                 std::string(c10::toString(result.scalar_type())) +
                                 ", the bucket " + std::to_string(bucket.data.numel()) + " of " +
                                 c10::toString(bucket.data.scalar_type()));
      }
      bucket.data.copy_(result.reshape(-1));
    }
    if (options_.timeline && span) {
      options_.timeline->span(
          "all-reduce bucket " + std::to_string(b) + " (" +
              std::to_string(bucket.data.numel() * bucket.data.element_size() / 1024) + " KiB)",
          "sync", span->start, span->end, Timeline::kCommThread);
    }
  }
}

void Reducer::hand_average(size_t param) {
  const torch::Tensor& average = slots_[param].view;
  torch::Tensor& grad = params_[param].mutable_grad();
  if (options_.gradient_as_bucket_view) {
    if (!grad_is_view(param)) grad = average;  // only a parameter unused on this rank
  } else if (grad.defined()) {
    grad.copy_(average);
  } else {
    grad = average.clone();
  }
}

void Reducer::finish_backward(bool shadow) {
  struct EndBackward {
    bool& flag;
    ~EndBackward() { flag = false; }
  } end{in_backward_};
  const auto start = Clock::now();

  // 1. Gradients that never came count as zero here; launch every bucket still waiting.
  const int64_t n = static_cast<int64_t>(params_.size());
  torch::Tensor used = torch::zeros({n}, torch::kByte);
  auto used_here = used.accessor<uint8_t, 1>();
  for (size_t i = 0; i < params_.size(); ++i) {
    Slot& slot = slots_[i];
    if (slot.bucket == kNoBucket || slot.ready) {
      used_here[static_cast<int64_t>(i)] = 1;
      continue;
    }
    // A grad() that is the view keeps its value apart, in case no rank used the parameter.
    if (grad_is_view(i)) params_[i].mutable_grad() = slot.view.clone();
    slot.view.zero_();
    slot.ready = true;
    // A shadowing rank adds zeros; it does not make a parameter "unused" where that is an error.
    if (shadow && !options_.find_unused_parameters) used_here[static_cast<int64_t>(i)] = 1;
    --buckets_[slot.bucket].pending;
  }
  launch_ready_buckets();

  // 2. Wait for every bucket; only then exchange which parameters got a gradient on which rank
  // (two threads in Open MPI's progress engine at once slow TCP transfers).
  wait_for_buckets();
  const torch::Tensor used_by = control_comm_.all_gather(used);  // [ranks, params]

  // 3. Hand the averages to grad().
  int64_t bytes = 0;
  for (const Bucket& b : buckets_)
    bytes += b.data.numel() * static_cast<int64_t>(b.data.element_size());
  sync_bytes_ += bytes;
  const torch::Tensor used_anywhere = used_by.to(torch::kLong).sum(0).gt(0);
  auto anywhere = used_anywhere.accessor<bool, 1>();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (slots_[i].bucket != kNoBucket && anywhere[static_cast<int64_t>(i)]) hand_average(i);
  }
  sync_seconds_ += seconds_since(start);  // with hook_then_optimizer, the steps' time too
  if (options_.timeline)
    options_.timeline->span("wait for gradient sync", "sync", start, Clock::now());
  if (rebuild_pending_) rebuild_buckets();

  // 4. Unused parameters: an error on every rank unless they were declared possible.
  if (options_.find_unused_parameters) return;
  std::ostringstream missing;
  int count = 0;
  bool unused_everywhere = false;
  auto by_rank = used_by.accessor<uint8_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    std::string ranks;
    for (int64_t r = 0; r < used_by.size(0); ++r) {
      if (!by_rank[r][i]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    }
    if (ranks.empty()) continue;
    unused_everywhere = unused_everywhere || !anywhere[i];
    if (count++ < 10)
      missing << (count > 1 ? ", " : "") << "'" << names_[i] << "' (rank " << ranks << ")";
  }
  if (count > 0) {
    throw std::runtime_error(detail::unused_parameters_error(
        count, missing.str() + (count > 10 ? ", ..." : ""), unused_everywhere));
  }
}

}  // namespace ddp
