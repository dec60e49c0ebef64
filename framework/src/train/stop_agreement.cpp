#include <ddp/train/stop_agreement.h>

#include <ddp/communicator.h>

#include "util/clock.h"

#include <torch/torch.h>

#include <stdexcept>

namespace ddp {

StopAgreement::StopAgreement(ProcessGroup& group, int64_t every) : group_(group), every_(every) {
  if (every < 0) {
    throw std::invalid_argument("StopAgreement: every must be >= 0 (got " + std::to_string(every) +
                                ")");
  }
  if (every > 0) handlers_.emplace();
}

bool StopAgreement::should_stop(int64_t step) {
  std::vector<double> none;
  return should_stop(step, none);
}

bool StopAgreement::should_stop(int64_t step, std::vector<double>& agreed) {
  checked_ = false;
  if (signal_ != 0) return true;
  if (every_ == 0 || step % every_ != 0) return false;
  // Every rank says whether it got a stop signal; the maximum tells each rank the same answer,
  // so all stop before the same step. Doubles carry the signal and the rank exactly.
  const int signal = stop_signal();
  std::vector<double> values{static_cast<double>(signal), signal ? double(group_.rank()) : -1.0,
                             seconds_since_stop_signal()};
  values.insert(values.end(), agreed.begin(), agreed.end());
  torch::Tensor flag = torch::tensor(values, torch::kDouble);
  group_.cpu().all_reduce(flag, ReduceOp::Max);
  checked_ = true;
  const auto f = flag.accessor<double, 1>();
  for (size_t i = 0; i < agreed.size(); ++i) agreed[i] = f[static_cast<int64_t>(3 + i)];
  if (f[0] <= 0) return false;
  signal_ = static_cast<int>(f[0]);
  rank_ = static_cast<int>(f[1]);
  waited_ = f[2];
  decided_at_ = Clock::now();
  mark_stopping();  // this rank may not have got the signal itself (stop_signal.h)
  return true;
}

double StopAgreement::seconds_since_signal() const {
  return signal_ ? waited_ + seconds_since(decided_at_) : 0.0;
}

std::string StopAgreement::describe() const {
  return std::string(stop_signal_name(signal_)) + " (rank " + std::to_string(rank_) + ")";
}

}  // namespace ddp
