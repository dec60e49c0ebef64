#include <ddp/reducer.h>

#include <ddp/timeline.h>

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>

#include <chrono>
#include <sstream>
#include <stdexcept>
#include <utility>

namespace ddp {

namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kNoBucket = static_cast<size_t>(-1);

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

const char* name_of(GradSync sync) {
  return sync == GradSync::Bucketed ? "bucketed" : "per-parameter";
}

const char* name_of(Compression c) {
  switch (c) {
    case Compression::None: return "none";
    case Compression::Fp16: return "fp16";
    case Compression::Bf16: return "bf16";
  }
  return "?";
}

}  // namespace

GradSync parse_grad_sync(const std::string& name) {
  if (name == "bucketed") return GradSync::Bucketed;
  if (name == "per-parameter") return GradSync::PerParameter;
  throw std::invalid_argument("unknown gradient sync '" + name +
                              "' (expected bucketed or per-parameter)");
}

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::None;
  if (name == "fp16") return Compression::Fp16;
  if (name == "bf16") return Compression::Bf16;
  throw std::invalid_argument("unknown compression '" + name + "' (expected none, fp16 or bf16)");
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  throw std::invalid_argument("unknown backend '" + name + "' (expected auto, mpi or nccl)");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Mpi: return "mpi";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

Backend resolve_backend(Backend requested, torch::Device params_device, torch::Device rank_device,
                        bool nccl_built) {
  if (requested == Backend::Mpi) return Backend::Mpi;
  if (requested == Backend::Auto) {
    const bool nccl = nccl_built && params_device.is_cuda() && params_device == rank_device;
    return nccl ? Backend::Nccl : Backend::Mpi;
  }
  const std::string option = "DDPOptions::backend is nccl, but ";
  if (!params_device.is_cuda()) {
    throw std::invalid_argument(option + "the parameters are on " + params_device.str() +
                                ": NCCL reduces CUDA tensors only (move the model to "
                                "runtime.device(), or use Backend::Mpi or Backend::Auto)");
  }
  if (!nccl_built) {
    throw std::invalid_argument(option +
                                "this build of ddp has no NCCL communicator (configure it with a "
                                "CUDA LibTorch and NCCL >= 2.10, see docs/gpu.md; or use "
                                "Backend::Mpi or Backend::Auto)");
  }
  if (params_device != rank_device) {
    throw std::invalid_argument(option + "the parameters are on " + params_device.str() +
                                " and this rank's NCCL communicator works on " +
                                rank_device.str() +
                                " (Runtime::device()): move the model to runtime.device()");
  }
  return Backend::Nccl;
}

Reducer::Reducer(Runtime& runtime, std::vector<torch::Tensor> params,
                 std::vector<std::string> names, DDPOptions options)
    : runtime_(runtime),
      options_(options),
      params_(std::move(params)),
      names_(std::move(names)),
      control_comm_(runtime.comm()) {
  if (options_.bucket_cap_mb <= 0 || options_.first_bucket_mb <= 0) {
    throw std::invalid_argument("DistributedDataParallel: bucket sizes must be > 0 MiB (got cap " +
                                std::to_string(options_.bucket_cap_mb) + ", first " +
                                std::to_string(options_.first_bucket_mb) + ")");
  }
  const torch::Device device =
      params_.empty() ? torch::Device(torch::kCPU) : params_.front().device();
  options_.backend =
      resolve_backend(options_.backend, device, runtime.device(), nccl_communicator_built());
  const bool nccl = options_.backend == Backend::Nccl;
  if (!nccl && options_.sync == GradSync::Bucketed &&
      runtime.mpi_thread_level() < MPI_THREAD_MULTIPLE) {
    throw std::runtime_error(
        "DistributedDataParallel: bucketed gradient sync all-reduces on a communication thread "
        "and needs MPI_THREAD_MULTIPLE, but this MPI provides thread level " +
        std::to_string(runtime.mpi_thread_level()) +
        "; use an MPI built with thread support, or GradSync::PerParameter (--grad-sync "
        "per-parameter)");
  }
  // Reverse registration order: roughly the order in which backward produces gradients.
  std::vector<size_t> order;
  for (size_t k = params_.size(); k-- > 0;) {
    if (params_[k].requires_grad()) order.push_back(k);
  }
  build_buckets(order);
  check_layout_across_ranks();  // before the backends' collectives: they must match too
  rebuild_pending_ = options_.rebuild_buckets && options_.sync == GradSync::Bucketed;
  if (nccl) {
    async_comm_ = &runtime.gpu_communicator();
    data_comm_ = async_comm_;
    in_flight_.resize(buckets_.size());
  } else {
    mpi_data_comm_ = std::make_unique<MpiCommunicator>(runtime.comm());
    data_comm_ = mpi_data_comm_.get();
  }

  for (size_t i = 0; i < params_.size(); ++i) {
    if (slots_[i].bucket != kNoBucket) attach_hook(i);
  }
  if (!nccl && options_.sync == GradSync::Bucketed) {
    comm_thread_ = std::thread([this] { comm_thread_loop(); });
  }
}

Reducer::~Reducer() {
  for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
  if (comm_thread_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    work_ready_.notify_all();
    comm_thread_.join();
  }
}

void Reducer::attach_hook(size_t param) {
  NodePtr accumulator = torch::autograd::impl::grad_accumulator(params_[param]);
  const uintptr_t key = accumulator->add_post_hook(
      std::make_unique<torch::autograd::utils::LambdaPostHook>(
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
  buckets_.clear();
  slots_.assign(params_.size(), Slot{kNoBucket, 0, false});
  const double mib = 1024.0 * 1024.0;
  auto cap_bytes = [&](size_t bucket) {
    return (bucket == 0 ? options_.first_bucket_mb : options_.bucket_cap_mb) * mib;
  };
  std::vector<size_t> current;
  double current_bytes = 0;
  auto close = [&] {
    if (current.empty()) return;
    Bucket bucket;
    bucket.params = current;
    int64_t numel = 0;
    for (size_t i : current) {
      slots_[i] = Slot{buckets_.size(), numel, false};
      numel += params_[i].numel();
    }
    const torch::Tensor& first = params_[current.front()];
    bucket.data = torch::zeros({numel}, first.options().requires_grad(false));
    if (options_.compression != Compression::None) {
      // Allocated once: with NCCL the wire tensor is in use on another stream until the end of
      // backward, and a tensor allocated per step could be handed out again too early.
      bucket.wire = torch::empty(
          {numel}, bucket.data.options().dtype(options_.compression == Compression::Fp16
                                                   ? torch::kHalf
                                                   : torch::kBFloat16));
    }
    bucket.pending = current.size();
    buckets_.push_back(std::move(bucket));
    current.clear();
    current_bytes = 0;
  };
  for (size_t k : order) {
    const torch::Tensor& p = params_[k];
    const double bytes = static_cast<double>(p.numel()) * static_cast<double>(p.element_size());
    const bool new_bucket =
        options_.sync == GradSync::PerParameter ||
        (!current.empty() && (p.scalar_type() != params_[current.front()].scalar_type() ||
                              current_bytes + bytes > cap_bytes(buckets_.size())));
    if (new_bucket) close();
    current.push_back(k);
    current_bytes += bytes;
    if (bytes >= options_.first_bucket_mb * mib) close();  // large: launch it as soon as it is ready
  }
  close();
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
  if (async_comm_) in_flight_.resize(buckets_.size());
  rebuild_pending_ = false;
  ready_order_.clear();
}

void Reducer::check_layout_across_ranks() {
  std::ostringstream layout;
  layout << "backend " << backend_name(options_.backend) << ", sync " << name_of(options_.sync)
         << ", compression " << name_of(options_.compression) << ", " << buckets_.size()
         << " buckets:";
  for (const Bucket& b : buckets_) layout << " " << b.data.scalar_type() << "[" << b.data.numel() << "]";
  const std::vector<std::string> all = all_gather_strings(control_comm_, layout.str());
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) {
      throw std::runtime_error(
          "DistributedDataParallel: ranks would issue different collectives (bucket layouts "
          "differ; use the same options on every rank):\n  rank 0: " + all[0] + "\n  rank " +
          std::to_string(r) + ": " + all[r]);
    }
  }
}

std::vector<std::vector<size_t>> Reducer::bucket_layout() const {
  std::vector<std::vector<size_t>> layout;
  for (const Bucket& b : buckets_) layout.push_back(b.params);
  return layout;
}

torch::Tensor Reducer::view_of(size_t param) {
  const Slot& slot = slots_[param];
  return buckets_[slot.bucket].data.narrow(0, slot.offset, params_[param].numel());
}

void Reducer::on_gradient_ready(size_t param) {
  if (!sync_enabled_) return;  // no_sync(): accumulate locally
  if (!in_backward_) begin_backward();
  Slot& slot = slots_[param];
  if (slot.ready) {
    throw std::runtime_error("DistributedDataParallel: the gradient of '" + names_[param] +
                             "' arrived twice in one backward pass (reentrant or double "
                             "backward is not supported)");
  }
  const torch::Tensor& grad = params_[param].grad();
  if (grad.is_sparse()) {
    throw std::runtime_error("DistributedDataParallel: '" + names_[param] +
                             "' has a sparse gradient, which is not supported");
  }
  view_of(param).copy_(grad.reshape(-1));
  slot.ready = true;
  if (rebuild_pending_) ready_order_.push_back(param);
  if (--buckets_[slot.bucket].pending == 0) launch_ready_buckets();
}

void Reducer::begin_backward() {
  in_backward_ = true;
  next_to_launch_ = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    completed_ = 0;
  }
  for (Slot& slot : slots_) slot.ready = false;
  for (Bucket& bucket : buckets_) bucket.pending = bucket.params.size();
  ready_order_.clear();  // a backward that failed before step 5 may have left a partial order
  torch::autograd::Engine::get_default_engine().queue_callback([this] { finish_backward(); });
}

void Reducer::launch_ready_buckets() {
  // Strictly in bucket order, so every rank issues the same collectives in the same order.
  while (next_to_launch_ < buckets_.size() && buckets_[next_to_launch_].pending == 0) {
    const size_t b = next_to_launch_++;
    if (async_comm_) {
      in_flight_[b] = async_comm_->all_reduce_async(prepare(b), ReduceOp::Sum);
      if (options_.timeline) {
        options_.timeline->instant("queue bucket " + std::to_string(b) + " on the NCCL stream",
                                   "sync", Clock::now());
      }
    } else if (options_.sync == GradSync::PerParameter) {
      const auto start = Clock::now();
      reduce(b);
      sync_seconds_ += seconds_since(start);
      std::lock_guard<std::mutex> lock(mutex_);
      ++completed_;
    } else {
      if (options_.timeline) options_.timeline->instant("queue bucket " + std::to_string(b), "sync", Clock::now());
      {
        std::lock_guard<std::mutex> lock(mutex_);
        queue_.push_back(b);
      }
      work_ready_.notify_one();
    }
  }
}

torch::Tensor Reducer::prepare(size_t b) {
  Bucket& bucket = buckets_[b];
  // Dividing first keeps fp16 sums of large gradients from overflowing.
  bucket.data.div_(data_comm_->size());
  if (!bucket.wire.defined()) return bucket.data;
  bucket.wire.copy_(bucket.data);
  return bucket.wire;
}

void Reducer::complete(size_t b) {
  Bucket& bucket = buckets_[b];
  if (bucket.wire.defined()) bucket.data.copy_(bucket.wire);
}

void Reducer::reduce(size_t b) {
  const auto start = Clock::now();
  data_comm_->all_reduce(prepare(b), ReduceOp::Sum);
  complete(b);
  const torch::Tensor& data = buckets_[b].data;
  if (options_.timeline) {
    const auto lane = options_.sync == GradSync::Bucketed ? Timeline::kCommThread : Timeline::kMainThread;
    options_.timeline->span("all-reduce bucket " + std::to_string(b) + " (" +
                                std::to_string(data.numel() * data.element_size() / 1024) + " KiB)",
                            "sync", start, Clock::now(), lane);
  }
}

void Reducer::comm_thread_loop() {
  for (;;) {
    size_t b;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      work_ready_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, nothing left
      b = queue_.front();
      queue_.pop_front();
    }
    std::exception_ptr error;
    try {
      reduce(b);
    } catch (...) {
      error = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (error && !comm_error_) comm_error_ = error;
      ++completed_;
    }
    work_done_.notify_all();
  }
}

void Reducer::wait_for_buckets() {
  if (async_comm_) {
    for (size_t b = 0; b < buckets_.size(); ++b) {
      std::exchange(in_flight_[b], nullptr)->wait();
      complete(b);
    }
    return;
  }
  std::unique_lock<std::mutex> lock(mutex_);
  work_done_.wait(lock, [&] { return completed_ == buckets_.size(); });
  if (comm_error_) std::rethrow_exception(std::exchange(comm_error_, nullptr));
}

void Reducer::finish_backward() {
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
    view_of(i).zero_();
    slot.ready = true;
    --buckets_[slot.bucket].pending;
  }
  launch_ready_buckets();

  // 2. Wait for every bucket. Only then: which parameters got a gradient on which rank. (Two
  // threads in Open MPI's progress engine at once slowed TCP transfers down by half.)
  wait_for_buckets();
  const torch::Tensor used_by = control_comm_.all_gather(used);  // [ranks, params]

  // 3. Hand the averages to grad().
  int64_t bytes = 0;
  for (const Bucket& b : buckets_) bytes += b.data.numel() * static_cast<int64_t>(b.data.element_size());
  sync_bytes_ += bytes;
  const torch::Tensor used_anywhere = used_by.to(torch::kLong).sum(0).gt(0);
  auto anywhere = used_anywhere.accessor<bool, 1>();
  for (size_t i = 0; i < params_.size(); ++i) {
    if (slots_[i].bucket == kNoBucket || !anywhere[static_cast<int64_t>(i)]) continue;
    torch::Tensor average = view_of(i).view(params_[i].sizes());
    torch::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined()) {
      grad.copy_(average);
    } else {
      grad = average.clone();
    }
  }
  sync_seconds_ += seconds_since(start);
  if (options_.timeline) options_.timeline->span("wait for gradient sync", "sync", start, Clock::now());
  if (rebuild_pending_) rebuild_buckets();

  // 4. Unused parameters: an error on every rank unless they were declared possible.
  if (options_.find_unused_parameters) return;
  std::ostringstream missing;
  int count = 0;
  auto by_rank = used_by.accessor<uint8_t, 2>();
  for (int64_t i = 0; i < n; ++i) {
    std::string ranks;
    for (int64_t r = 0; r < used_by.size(0); ++r) {
      if (!by_rank[r][i]) ranks += (ranks.empty() ? "" : ",") + std::to_string(r);
    }
    if (ranks.empty()) continue;
    if (count++ < 10) missing << (count > 1 ? ", " : "") << "'" << names_[i] << "' (rank " << ranks << ")";
  }
  if (count > 0) {
    throw std::runtime_error(
        "DistributedDataParallel: " + std::to_string(count) +
        " parameter(s) got no gradient in this backward pass: " + missing.str() +
        (count > 10 ? ", ..." : "") +
        ". Make every parameter that requires grad contribute to the loss on every rank, or "
        "set find_unused_parameters (--find-unused-parameters) to count them as zero");
  }
}

}  // namespace ddp
