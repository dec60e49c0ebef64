#include "parallel/unused_parameters.h"

#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/nn/modules/conv.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <memory>
#include <stdexcept>
#include <type_traits>
#include <utility>

namespace ddp::detail {

std::string unused_parameters_error(int count, const std::string& listed, bool unused_everywhere) {
  std::string text = "DistributedDataParallel: " + std::to_string(count) +
                     " parameter(s) got no gradient in this backward pass: " + listed + ". ";
  if (unused_everywhere) {
    text +=
        "A parameter that no rank's forward uses is most often a module member reassigned after "
        "register_parameter registered it (`lm_head->weight = wte->weight` changes the member "
        "that forward computes with, not the registered parameter that the optimizer steps, the "
        "ranks average and a snapshot saves): compute with the one registered tensor instead "
        "(tie weights as docs/porting.md says). Otherwise, make";
  } else {
    text += "Make";
  }
  return text +
         " every parameter that requires grad contribute to the loss on every rank, or, for "
         "parameters unused by design, set DDPOptions::find_unused_parameters to count them as "
         "zero";
}

namespace {

// One member of a LibTorch layer against its registered parameter.
void check_layer_member(const std::string& path, const char* layer, const torch::nn::Module& module,
                        const char* name, const torch::Tensor& member,
                        std::vector<std::string>& lines) {
  const auto registered = module.named_parameters(/*recurse=*/false);
  const torch::Tensor* own = registered.find(name);
  const bool same = own ? member.defined() && own->is_same(member) : !member.defined();
  if (same) return;
  lines.push_back("'" + (path.empty() ? std::string() : path + ".") + name + "' (" + layer +
                  "'s member " + name + ")");
}

template <typename Layer>
bool check_layer_members(const std::string& path, const torch::nn::Module& module,
                         const char* layer, std::vector<std::string>& lines) {
  const auto* as = dynamic_cast<const Layer*>(&module);
  if (!as) return false;
  check_layer_member(path, layer, module, "weight", as->weight, lines);
  if constexpr (!std::is_same_v<Layer, torch::nn::EmbeddingImpl>) {
    check_layer_member(path, layer, module, "bias", as->bias, lines);
  }
  return true;
}

}  // namespace

std::vector<std::string> reassigned_members(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  // The module itself, then what is inside it (include_self needs it held by a shared_ptr).
  std::vector<std::pair<std::string, const torch::nn::Module*>> modules{{"", &module}};
  for (const auto& item : module.named_modules("", /*include_self=*/false))
    modules.emplace_back(item.key(), item.value().get());
  for (const auto& [path, inside] : modules) {
    const torch::nn::Module& m = *inside;
    check_layer_members<torch::nn::LinearImpl>(path, m, "torch::nn::Linear", lines) ||
        check_layer_members<torch::nn::EmbeddingImpl>(path, m, "torch::nn::Embedding", lines) ||
        check_layer_members<torch::nn::Conv1dImpl>(path, m, "torch::nn::Conv1d", lines) ||
        check_layer_members<torch::nn::Conv2dImpl>(path, m, "torch::nn::Conv2d", lines) ||
        check_layer_members<torch::nn::Conv3dImpl>(path, m, "torch::nn::Conv3d", lines) ||
        check_layer_members<torch::nn::LayerNormImpl>(path, m, "torch::nn::LayerNorm", lines);
  }
  return lines;
}

FirstBackwardCheck::FirstBackwardCheck(std::vector<torch::Tensor> params,
                                       std::vector<std::string> names)
    : params_(std::move(params)), names_(std::move(names)), got_(params_.size(), false) {
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_[i].requires_grad()) attach(i);
  }
}

FirstBackwardCheck::~FirstBackwardCheck() { remove_hooks(); }

void FirstBackwardCheck::attach(size_t param) {
  NodePtr accumulator = torch::autograd::impl::grad_accumulator(params_[param]);
  const uintptr_t key =
      accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
          [this, param](const torch::autograd::variable_list& outputs,
                        const torch::autograd::variable_list& /*inputs*/) {
            on_gradient(param);
            return outputs;
          }));
  hooks_.push_back(Hook{param, std::move(accumulator), key});
}

void FirstBackwardCheck::remove_hooks() {
  for (auto& hook : hooks_) hook.accumulator->del_post_hook(hook.key);
  hooks_.clear();
}

void FirstBackwardCheck::reattach_hooks() {
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
  for (size_t param : replaced) attach(param);
}

void FirstBackwardCheck::on_gradient(size_t param) {
  if (!sync_enabled_) return;
  if (!in_backward_) {
    in_backward_ = true;
    torch::autograd::Engine::get_default_engine().queue_callback([this] { finish(); });
  }
  got_[param] = true;
}

void FirstBackwardCheck::finish() {
  in_backward_ = false;
  std::vector<size_t> checked;
  for (const Hook& hook : hooks_) checked.push_back(hook.param);
  remove_hooks();  // one backward checked: the later ones cost nothing
  std::string listed;
  int count = 0;
  for (size_t i : checked) {
    if (got_[i]) continue;
    if (count++ < 10) listed += (count > 1 ? ", '" : "'") + names_[i] + "' (rank 0)";
  }
  if (count == 0) return;
  if (count > 10) listed += ", ...";
  throw std::runtime_error(unused_parameters_error(count, listed, /*unused_everywhere=*/true));
}

}  // namespace ddp::detail
