#pragma once
// What must agree for two models to exchange state (internal).

#include <torch/nn/module.h>

#include <string>
#include <vector>

namespace ddp {

// One line per parameter, then per buffer, in registration order, e.g.
//   "parameter 'fc1.weight' Float [128, 9216]" (" frozen" when it does not require grad).
// What must agree for two models to exchange state: DistributedDataParallel's structure check
// across ranks and a snapshot's fit to a model compare these lines.
std::vector<std::string> describe_tensors(const torch::nn::Module& module);

}  // namespace ddp
