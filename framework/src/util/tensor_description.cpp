#include "util/tensor_description.h"

#include <sstream>

namespace ddp {

std::vector<std::string> describe_tensors(const torch::nn::Module& module) {
  std::vector<std::string> lines;
  auto add = [&](const char* kind, const std::string& name, const torch::Tensor& t) {
    std::ostringstream line;
    line << kind << " '" << name << "' " << t.scalar_type() << " " << t.sizes()
         << (t.requires_grad() ? "" : " frozen");
    lines.push_back(line.str());
  };
  for (const auto& p : module.named_parameters()) add("parameter", p.key(), p.value());
  for (const auto& b : module.named_buffers()) add("buffer", b.key(), b.value());
  return lines;
}

}  // namespace ddp
