#include <ddp/communicator.h>

#include <torch/torch.h>

#include <algorithm>

namespace ddp {

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
