#include "parallel/bucketing.h"

namespace ddp {

std::vector<std::vector<size_t>> assign_buckets(const std::vector<ParameterSize>& params,
                                                const std::vector<size_t>& order, BucketCaps caps) {
  std::vector<std::vector<size_t>> buckets;
  std::vector<size_t> current;
  double current_bytes = 0;
  auto close = [&] {
    if (current.empty()) return;
    buckets.push_back(std::move(current));
    current.clear();
    current_bytes = 0;
  };
  for (size_t k : order) {
    const ParameterSize& p = params.at(k);
    const double bytes = static_cast<double>(p.bytes);
    const double cap = buckets.empty() ? caps.first_bytes : caps.cap_bytes;
    if (!current.empty() &&
        (p.dtype != params[current.front()].dtype || current_bytes + bytes > cap)) {
      close();
    }
    current.push_back(k);
    current_bytes += bytes;
    if (bytes >= caps.first_bytes) close();  // large: launch it as soon as it is ready
  }
  close();
  return buckets;
}

}  // namespace ddp
