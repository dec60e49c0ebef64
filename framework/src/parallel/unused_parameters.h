#pragma once
// Parameters that get no gradient. A parameter the forward never uses trains nowhere: at more than
// one rank the Reducer names it after every backward (reducer.h, step 4); at one rank, without a
// Reducer, FirstBackwardCheck names it after the first. Its most common cause in C++ is a module
// member reassigned after it was registered: LibTorch keeps a parameter twice, as a member (what
// forward computes with) and registered by register_parameter (what parameters() lists, what the
// optimizer steps, DDP averages and a snapshot saves), and `lm_head->weight = wte->weight`, the
// literal C++ of Python's weight tie, changes only the member. For LibTorch's own layers that is
// seen at once (reassigned_members).

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::detail {

// The error of `count` parameters without a gradient, `listed` ("'a.weight' (rank 0,1), ...").
// `unused_everywhere`: some got none on any rank, as a reassigned member does: the message then
// names that cause and its fix before find_unused_parameters.
std::string unused_parameters_error(int count, const std::string& listed, bool unused_everywhere);

// The members of LibTorch's layers inside `module` (Linear, Embedding, Conv1d-3d, LayerNorm:
// weight, bias) that are not their registered parameter, one line each, by dotted name:
// "'lm_head.weight' (torch::nn::Linear's member weight)". Empty when every member is its own.
std::vector<std::string> reassigned_members(const torch::nn::Module& module);

// At one rank without a Reducer: hooks on the grad accumulators of `params` (those that require
// grad) see the first synchronised backward that reaches them, then go. A parameter without a
// gradient in it is unused_parameters_error, thrown from the end of that backward, as the Reducer
// does. Local.
class FirstBackwardCheck {
 public:
  FirstBackwardCheck(std::vector<torch::Tensor> params, std::vector<std::string> names);
  ~FirstBackwardCheck();
  FirstBackwardCheck(const FirstBackwardCheck&) = delete;
  FirstBackwardCheck& operator=(const FirstBackwardCheck&) = delete;

  // false inside no_sync(): such a backward is not checked (nor is it at more ranks).
  void set_sync_enabled(bool enabled) { sync_enabled_ = enabled; }
  bool sync_enabled() const { return sync_enabled_; }
  // Re-attaches hooks whose accumulator autograd replaced (Module::load), as the Reducer does.
  void reattach_hooks();

 private:
  using NodePtr =
      decltype(torch::autograd::impl::grad_accumulator(std::declval<const torch::Tensor&>()));
  struct Hook {
    size_t param;
    NodePtr accumulator;
    uintptr_t key;
  };
  void attach(size_t param);
  void remove_hooks();
  void on_gradient(size_t param);
  void finish();  // at the end of the checked backward (an engine callback)

  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<Hook> hooks_;
  std::vector<bool> got_;
  bool sync_enabled_ = true;
  bool in_backward_ = false;
};

}  // namespace ddp::detail
