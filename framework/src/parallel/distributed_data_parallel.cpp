#include <ddp/distributed_data_parallel.h>

#include "comm/agreement.h"
#include "parallel/reducer.h"
#include "parallel/resolve_backend.h"
#include "parallel/unused_parameters.h"
#include "util/tensor_description.h"

#include <c10/core/GradMode.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <string>
#include <unordered_set>

namespace ddp {

namespace {

std::string join(const std::vector<std::string>& lines) {
  std::string text;
  for (const auto& line : lines) text += line + "\n";
  return text;
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// Gathers every rank's description (CPU collectives only) and throws the same message on every
// rank when any differs from rank 0's.
void verify_same_structure(Communicator& comm, const torch::nn::Module& module) {
  std::vector<std::vector<std::string>> per_rank;
  for (const auto& text : all_gather_strings(comm, join(describe_tensors(module)))) {
    per_rank.push_back(split(text));
  }
  const auto& reference = per_rank[0];
  size_t first = SIZE_MAX;
  for (const auto& lines : per_rank) {
    for (size_t i = 0; i < std::max(lines.size(), reference.size()); ++i) {
      if (i >= lines.size() || i >= reference.size() || lines[i] != reference[i]) {
        first = std::min(first, i);
        break;
      }
    }
  }
  if (first == SIZE_MAX) return;

  std::ostringstream msg;
  msg << "DistributedDataParallel: the model differs across ranks at entry " << first << ":";
  auto entry = [&](const std::vector<std::string>& lines) {
    return first < lines.size() ? lines[first]
                                : "(none: " + std::to_string(lines.size()) + " entries)";
  };
  msg << "\n  rank 0: " << entry(reference);
  std::vector<int> differing;
  for (int r = 1; r < comm.size(); ++r) {
    if (entry(per_rank[r]) != entry(reference)) {
      differing.push_back(r);
      msg << "\n  rank " << r << ": " << entry(per_rank[r]);
    }
  }
  msg << "\n  every rank must build the same model (ranks differing from rank 0:";
  for (int r : differing) msg << " " << r;
  msg << ")";
  throw std::runtime_error(msg.str());
}

// The backend (Auto resolved) for the module's parameters; the same on every rank or an error on
// every rank, since ranks on different backends would issue different collectives.
Backend choose_backend(ProcessGroup& group, const torch::nn::Module& module, Backend requested) {
  const auto params = module.named_parameters();
  const torch::Device device =
      params.is_empty() ? torch::Device(torch::kCPU) : params.begin()->value().device();
  const Backend backend =
      resolve_backend(requested, device, group.device(), nccl_communicator_built());
  if (backend == Backend::Nccl) {
    // NCCL reaches one device: the communicator's.
    auto check = [&](const char* kind, const std::string& name, const torch::Tensor& t) {
      if (t.device() == device) return;
      throw std::invalid_argument("DistributedDataParallel: " + std::string(kind) + " '" + name +
                                  "' is on " + t.device().str() +
                                  ", but the NCCL backend works on " + device.str() +
                                  ": move the whole model to Runtime::device()");
    };
    for (const auto& p : params) check("parameter", p.key(), p.value());
    for (const auto& b : module.named_buffers()) check("buffer", b.key(), b.value());
  }
  require_agreement(group.cpu(), "DistributedDataParallel: the backend", backend_name(backend),
                    "Backend::Auto picks NCCL where the parameters are on the rank's GPU: give "
                    "every rank one, or set DDPOptions::backend");
  return backend;
}

// The live wrappers (live_wrappers()), oldest first; owns nothing. Never destroyed: a wrapper
// with static storage is destroyed at exit, after a static list would be.
struct LiveWrappers {
  std::mutex mutex;
  std::vector<DistributedDataParallel*> wrappers;
};
LiveWrappers& live_wrapper_list() {
  static LiveWrappers* list = new LiveWrappers;
  return *list;
}

void broadcast_from(Communicator& comm, const torch::Tensor& t, int root) {
  if (t.is_contiguous()) {
    comm.broadcast(t, root);
  } else {
    torch::Tensor staging = t.contiguous();
    comm.broadcast(staging, root);
    t.copy_(staging);
  }
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 std::shared_ptr<torch::nn::Module> module,
                                                 DDPOptions options)
    : DistributedDataParallel(group, std::move(module), options, torch::nn::AnyModule()) {}

namespace {

// `script`'s parameters and buffers, the same tensors, in a torch::nn::Module tree of the same
// dotted names ("fc1.weight" is parameter "weight" of child "fc1"): gradient hooks attach to the
// tensors, so backward through the script's own forward reaches the Reducer.
std::shared_ptr<torch::nn::Module> module_of(const torch::jit::Module& script) {
  auto root = std::make_shared<torch::nn::Module>(
      script.type()->name() ? script.type()->name()->name() : "ScriptModule");
  auto place = [&](const std::string& dotted) {
    torch::nn::Module* at = root.get();
    size_t start = 0;
    for (size_t dot; (dot = dotted.find('.', start)) != std::string::npos; start = dot + 1) {
      const std::string child = dotted.substr(start, dot - start);
      auto children = at->named_children();
      at = children.contains(child)
               ? children[child].get()
               : at->register_module(child, std::make_shared<torch::nn::Module>(child)).get();
    }
    return std::make_pair(at, dotted.substr(start));
  };
  for (const auto& p : script.named_parameters(/*recurse=*/true)) {
    auto [at, name] = place(p.name);
    at->register_parameter(name, p.value, p.value.requires_grad());
  }
  for (const auto& b : script.named_buffers(/*recurse=*/true)) {
    auto [at, name] = place(b.name);
    at->register_buffer(name, b.value);
  }
  return root;
}

}  // namespace

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 const torch::jit::Module& script,
                                                 DDPOptions options)
    : DistributedDataParallel(group, module_of(script), options, torch::nn::AnyModule()) {}

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 std::shared_ptr<torch::nn::SequentialImpl> module,
                                                 DDPOptions options)
    : DistributedDataParallel(group, std::shared_ptr<torch::nn::Module>(module), options,
                              torch::nn::AnyModule()) {
  sequential_ = std::move(module);
}

DistributedDataParallel::DistributedDataParallel(ProcessGroup& group,
                                                 std::shared_ptr<torch::nn::Module> module,
                                                 DDPOptions options, torch::nn::AnyModule forward)
    : module_(std::move(module)),
      forward_(std::move(forward)),
      options_(options),
      world_size_(group.size()) {
  // Its first collectives wait for every rank to have built its model and got here.
  WatchedPhase phase("the DistributedDataParallel constructor");
  control_comm_ = group.new_cpu_communicator("DistributedDataParallel's control communicator");
  if (!module_) throw std::invalid_argument("DistributedDataParallel: module is null");
  // Local, alike on every rank (the same model code): before training, not after a run whose
  // saved weights were never trained.
  const std::vector<std::string> reassigned = detail::reassigned_members(*module_);
  if (!reassigned.empty()) {
    throw std::invalid_argument(
        "DistributedDataParallel: " + reassigned.front() +
        " is not the registered parameter of that name: the member was reassigned after "
        "register_parameter registered it (as `lm_head->weight = wte->weight` does), so forward "
        "computes with another tensor than the one the optimizer steps, the ranks average and a "
        "snapshot saves, which would never train. Tie weights by computing with the one "
        "registered tensor, e.g. torch::nn::functional::linear(x, wte->weight) for the head "
        "(docs/porting.md, \"Tied weights\")" +
        (reassigned.size() > 1 ? " (also: " + std::to_string(reassigned.size() - 1) + " more)"
                               : std::string()));
  }
  verify_same_structure(*control_comm_, *module_);
  options_.backend = choose_backend(group, *module_, options_.backend);
  if (options_.backend == Backend::Nccl) {
    comm_ = &group.gpu();
  } else {
    owned_comm_ = group.new_cpu_communicator("DistributedDataParallel's gradient communicator");
    comm_ = owned_comm_.get();
  }
  broadcast_model(0);
  // One rank: its gradients are the average, unless asked to run the bucket path anyway.
  if (world_size_ > 1 || options_.reducer_at_one_rank) {
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const auto& p : module_->named_parameters()) {
      names.push_back(p.key());
      params.push_back(p.value());
    }
    reducer_ = std::make_unique<Reducer>(*comm_, *control_comm_, std::move(params),
                                         std::move(names), options_);
  } else if (!options_.find_unused_parameters) {
    // What more ranks' Reducer would refuse is refused here too, after the first backward.
    std::vector<torch::Tensor> params;
    std::vector<std::string> names;
    for (const auto& p : module_->named_parameters()) {
      names.push_back(p.key());
      params.push_back(p.value());
    }
    first_backward_check_ =
        std::make_unique<detail::FirstBackwardCheck>(std::move(params), std::move(names));
  }
  // Last: a snapshot of the module finds this wrapper (live_wrappers()) once it is whole.
  LiveWrappers& live = live_wrapper_list();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.wrappers.push_back(this);
}

DistributedDataParallel::~DistributedDataParallel() {
  LiveWrappers& live = live_wrapper_list();
  std::lock_guard<std::mutex> lock(live.mutex);
  live.wrappers.erase(std::remove(live.wrappers.begin(), live.wrappers.end(), this),
                      live.wrappers.end());
}

std::vector<DistributedDataParallel*> DistributedDataParallel::live_wrappers() {
  LiveWrappers& live = live_wrapper_list();
  std::lock_guard<std::mutex> lock(live.mutex);
  return live.wrappers;
}

void DistributedDataParallel::set_sync_enabled(bool enabled) {
  if (reducer_) reducer_->set_sync_enabled(enabled);
  if (first_backward_check_) first_backward_check_->set_sync_enabled(enabled);
}

bool DistributedDataParallel::sync_enabled() const {
  if (reducer_) return reducer_->sync_enabled();
  return first_backward_check_ ? first_backward_check_->sync_enabled() : true;
}

double DistributedDataParallel::sync_seconds() const {
  return reducer_ ? reducer_->sync_seconds() : 0.0;
}

int64_t DistributedDataParallel::sync_bytes() const {
  return reducer_ ? reducer_->sync_bytes() : 0;
}

void DistributedDataParallel::register_comm_hook(CommHook hook) {
  const std::string what = "DistributedDataParallel::register_comm_hook: ";
  if (!hook) throw std::invalid_argument(what + "the hook is empty");
  if (const torch::optim::Optimizer* optimizer = hook.steps_optimizer()) {
    if (options_.find_unused_parameters) {
      throw std::invalid_argument(what +
                                  "a hook that steps the optimizer, not with "
                                  "DDPOptions::find_unused_parameters (a parameter no rank used "
                                  "keeps its gradient, known only after the last bucket)");
    }
    std::unordered_set<const c10::TensorImpl*> mine;
    for (const auto& p : module_->parameters()) mine.insert(p.unsafeGetTensorImpl());
    const auto& groups = optimizer->param_groups();
    for (size_t g = 0; g < groups.size(); ++g) {
      for (size_t k = 0; k < groups[g].params().size(); ++k) {
        if (!mine.count(groups[g].params()[k].unsafeGetTensorImpl())) {
          throw std::invalid_argument(what + "parameter " + std::to_string(k) +
                                      " of the "
                                      "optimizer's param group " +
                                      std::to_string(g) +
                                      " is not a "
                                      "parameter of the wrapped module, and no bucket would ever "
                                      "step it");
        }
      }
    }
  }
  if (reducer_) reducer_->set_comm_hook(std::move(hook));
}

torch::optim::Optimizer* DistributedDataParallel::backward_steps_optimizer() const {
  return reducer_ ? reducer_->comm_hook().steps_optimizer() : nullptr;
}

std::string DistributedDataParallel::comm_hook_description() const {
  return reducer_ ? reducer_->comm_hook().description() : "none";
}

bool DistributedDataParallel::comm_hook_has_state() const {
  return reducer_ && reducer_->comm_hook().state() != nullptr;
}

void DistributedDataParallel::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("comm_hook", c10::IValue(comm_hook_description()));
  std::vector<int64_t> order;
  if (reducer_) order.assign(reducer_->rebuilt_order().begin(), reducer_->rebuilt_order().end());
  archive.write("bucket_order", torch::tensor(order, torch::kLong));
  const CommHookState* state = reducer_ ? reducer_->comm_hook().state().get() : nullptr;
  if (state) {
    torch::serialize::OutputArchive hook_archive;
    state->save(hook_archive);
    archive.write("comm_hook_state", hook_archive);
  }
}

std::string DistributedDataParallel::load_state(torch::serialize::InputArchive& archive,
                                                bool same_rank) {
  c10::IValue saved_hook;
  torch::Tensor order;
  archive.read("comm_hook", saved_hook);
  archive.read("bucket_order", order);
  if (!saved_hook.isString() || order.scalar_type() != torch::kLong || order.dim() != 1) {
    throw std::runtime_error(
        "DistributedDataParallel::load_state: not a saved state of a "
        "DistributedDataParallel");
  }
  if (!reducer_) return "";  // one rank: nothing is bucketed or reduced
  order = order.contiguous();
  if (order.numel() > 0) {
    reducer_->restore_order(
        std::vector<size_t>(order.data_ptr<int64_t>(), order.data_ptr<int64_t>() + order.numel()));
  }
  torch::serialize::InputArchive hook_archive;
  const bool saved_state = archive.try_read("comm_hook_state", hook_archive);
  CommHookState* state = reducer_->comm_hook().state().get();
  if (!state && !saved_state) return "";
  const std::string& now = reducer_->comm_hook().description();
  if (saved_hook.toStringRef() != now) {
    // The settings check names the change of hook; a stateful hook starts afresh.
    return state ? "the comm hook " + now + " starts with a fresh state (the snapshot's run used " +
                       saved_hook.toStringRef() + ")"
                 : "";
  }
  if (!saved_state) {
    return "the comm hook " + now +
           " starts with a fresh state: the snapshot holds none (written "
           "by an older ddp)";
  }
  if (!same_rank) {
    return "the comm hook " + now +
           " starts with a fresh state: its state is per rank (error "
           "feedback), and the snapshot was written by another number of ranks";
  }
  state->load(hook_archive);
  return "";
}

std::vector<std::vector<size_t>> DistributedDataParallel::bucket_layout() const {
  return reducer_ ? reducer_->bucket_layout() : std::vector<std::vector<size_t>>{};
}

void DistributedDataParallel::before_forward() {
  if (!has_forward()) {
    throw std::logic_error(
        "DistributedDataParallel::forward: the wrapper holds a " + module_->name() +
        " as a plain torch::nn::Module pointer, whose forward() it cannot call (its type was not "
        "given, or its forward is overloaded or a template); build the wrapper from "
        "std::shared_ptr<" +
        module_->name() +
        "> if it has one forward() method, or call the "
        "module yourself after model.prepare_forward()");
  }
  reattach_hooks();
  // Evaluation (no grad) stays local: ranks may evaluate different numbers of batches.
  if (!c10::GradMode::is_enabled()) return;
  if (join_) count_training(true);
  broadcast_buffers();
}

void DistributedDataParallel::reattach_hooks() {
  if (reducer_) reducer_->reattach_hooks();
  if (first_backward_check_) first_backward_check_->reattach_hooks();
}

void DistributedDataParallel::prepare_forward() {
  reattach_hooks();
  if (join_) count_training(true);
  broadcast_buffers();
}

void DistributedDataParallel::broadcast_model(int root) {
  torch::NoGradGuard no_grad;
  for (const auto& p : module_->parameters()) broadcast_from(*comm_, p, root);
  for (const auto& b : module_->buffers()) broadcast_from(*comm_, b, root);
}

void DistributedDataParallel::broadcast_buffers() {
  if (!options_.broadcast_buffers || world_size_ == 1) return;
  // One flat broadcast per dtype: ResNet-18 has 60 small buffers, and a collective each would
  // cost more latency than the bytes.
  std::map<torch::ScalarType, std::vector<torch::Tensor>> by_dtype;
  for (const auto& b : module_->buffers()) by_dtype[b.scalar_type()].push_back(b);
  torch::NoGradGuard no_grad;
  for (auto& [dtype, buffers] : by_dtype) {
    std::vector<torch::Tensor> flat;
    for (const auto& b : buffers) flat.push_back(b.reshape({-1}));
    torch::Tensor packed = torch::cat(flat);
    comm_->broadcast(packed, buffer_root_);
    int64_t offset = 0;
    for (auto& b : buffers) {
      b.copy_(packed.narrow(0, offset, b.numel()).view_as(b));
      offset += b.numel();
    }
  }
}

}  // namespace ddp
