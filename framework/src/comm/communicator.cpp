#include <ddp/communicator.h>

#include "comm/collective.h"

#include <torch/torch.h>

#include <algorithm>

namespace ddp {

std::unique_ptr<Work> Communicator::all_reduce_after_fill(const torch::Tensor& tensor,
                                                          std::function<void()> fill, ReduceOp op) {
  if (fill) fill();
  return all_reduce_async(tensor, op);
}

// The fallbacks: any backend's all_reduce and all_gather, checked as the host backends check.
void Communicator::reduce_scatter(const torch::Tensor& output, const torch::Tensor& input,
                                  ReduceOp op) {
  detail::Rules rules;
  rules.prefix = backend() + " Communicator::";
  (void)detail::Collective::reduce_scatter(rules, output, input, op, size());
  const torch::Tensor reduced = input.clone();
  all_reduce(reduced, op);
  const int64_t n = output.numel();
  output.view({-1}).copy_(reduced.view({-1}).slice(0, rank() * n, (rank() + 1) * n));
}

void Communicator::all_gather_into(const torch::Tensor& output, const torch::Tensor& input) {
  detail::Rules rules;
  rules.prefix = backend() + " Communicator::";
  (void)detail::Collective::all_gather_into(rules, output, input, size());
  output.view({-1}).copy_(all_gather(input).view({-1}));
}

std::vector<std::string> all_gather_strings(Communicator& comm, const std::string& mine) {
  // Strings differ in length: pad every one to the longest, with its length in front.
  torch::Tensor longest = torch::tensor({static_cast<int64_t>(mine.size())}, torch::kLong);
  comm.all_reduce(longest, ReduceOp::Max);
  const int64_t width = longest.item<int64_t>() + 8;
  torch::Tensor bytes = torch::zeros({width}, torch::kByte);
  const int64_t length = static_cast<int64_t>(mine.size());
  std::copy_n(reinterpret_cast<const uint8_t*>(&length), 8, bytes.data_ptr<uint8_t>());
  std::copy(mine.begin(), mine.end(), bytes.data_ptr<uint8_t>() + 8);
  const torch::Tensor all = comm.all_gather(bytes);

  std::vector<std::string> result;
  for (int r = 0; r < comm.size(); ++r) {
    const uint8_t* row = all[r].data_ptr<uint8_t>();
    int64_t n = 0;
    std::copy_n(row, 8, reinterpret_cast<uint8_t*>(&n));
    result.emplace_back(reinterpret_cast<const char*>(row + 8), static_cast<size_t>(n));
  }
  return result;
}

}  // namespace ddp
