#include <ddp/train/stop_agreement.h>

#include <ddp/communicator.h>

#include "util/clock.h"

#include <torch/torch.h>

#include <stdexcept>
#include <vector>

namespace ddp {

StopAgreement::StopAgreement(ProcessGroup& group, int64_t every) : group_(group), every_(every) {
  if (every < 0) {
    throw std::invalid_argument("StopAgreement: every must be >= 0 (got " + std::to_string(every) +
                                ")");
  }
  if (every > 0) handlers_.emplace();
}

bool StopAgreement::should_stop(int64_t step) {
  if (signal_ != 0) return true;
  if (every_ == 0 || step % every_ != 0) return false;
  const std::array<double, kValues> mine = values();
  torch::Tensor agreed =
      torch::tensor(std::vector<double>(mine.begin(), mine.end()), torch::kDouble);
  group_.cpu().all_reduce(agreed, ReduceOp::Max);
  return decide(agreed.data_ptr<double>());
}

// Every rank says whether it got a stop signal; the maximum tells each rank the same answer, so
// all stop before the same step. Doubles carry the signal and the rank exactly.
std::array<double, StopAgreement::kValues> StopAgreement::values() const {
  const int signal = stop_signal();
  return {static_cast<double>(signal), signal ? double(group_.rank()) : -1.0,
          seconds_since_stop_signal()};
}

bool StopAgreement::decide(const double* agreed) {
  if (signal_ != 0) return true;
  if (agreed[0] <= 0) return false;
  signal_ = static_cast<int>(agreed[0]);
  rank_ = static_cast<int>(agreed[1]);
  waited_ = agreed[2];
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
