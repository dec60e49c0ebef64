#include <ddp/train/metrics.h>

#include "util/clock.h"

#include <torch/torch.h>

#include <stdexcept>
#include <string>
#include <utility>

namespace ddp {

namespace {

constexpr int64_t kFixed = 7;  // loss sum, samples, seconds, the four phases

torch::Tensor zero_on(torch::Device device) {
  return torch::zeros({}, torch::TensorOptions().dtype(torch::kDouble).device(device));
}

}  // namespace

EpochMeter::EpochMeter(std::vector<std::string> metrics, torch::Device device)
    : names_(std::move(metrics)), loss_sum_(zero_on(device)), start_(Clock::now()) {
  for (size_t i = 0; i < names_.size(); ++i) sums_.push_back(zero_on(device));
}

void EpochMeter::add(const torch::Tensor& loss, int64_t samples,
                     const std::vector<torch::Tensor>& sums) {
  if (!loss.defined() || loss.numel() != 1) {
    throw std::invalid_argument(
        "EpochMeter::add: the loss must be a scalar (got " +
        std::string(loss.defined() ? std::to_string(loss.numel()) + " elements" : "none") + ")");
  }
  if (sums.size() != sums_.size()) {
    throw std::invalid_argument("EpochMeter::add: " + std::to_string(sums.size()) +
                                " metric sum(s) for the " + std::to_string(sums_.size()) +
                                " metric name(s)");
  }
  for (size_t i = 0; i < sums.size(); ++i) {
    if (!sums[i].defined() || sums[i].numel() != 1) {
      throw std::invalid_argument("EpochMeter::add: metric sum " + std::to_string(i) + " (" +
                                  names_[i] + ") is not a scalar tensor");
    }
  }
  // On the device: no host synchronisation per step.
  loss_sum_ += loss.detach().reshape({}).to(loss_sum_.device(), torch::kDouble) *
               static_cast<double>(samples);
  for (size_t i = 0; i < sums.size(); ++i) {
    sums_[i] += sums[i].detach().reshape({}).to(sums_[i].device(), torch::kDouble);
  }
  samples_ += samples;
}

torch::Tensor EpochMeter::state(double sync_seconds) const {
  std::vector<double> values{loss_sum_.item<double>(),
                             static_cast<double>(samples_),
                             restored_seconds_ + seconds_since(start_),
                             phases_.data,
                             phases_.forward_backward,
                             phases_.sync + sync_seconds,
                             phases_.optimizer};
  for (const torch::Tensor& s : sums_) values.push_back(s.item<double>());
  return torch::tensor(values, torch::kDouble);
}

void EpochMeter::restore(const torch::Tensor& state) {
  const int64_t expected = kFixed + static_cast<int64_t>(names_.size());
  if (!state.defined() || state.dim() != 1 || state.numel() != expected) {
    throw std::runtime_error("EpochMeter: the saved epoch in progress has " +
                             std::to_string(state.defined() ? state.numel() : 0) +
                             " sums, but this one needs " + std::to_string(expected) +
                             " (7 and one per metric: " + std::to_string(names_.size()) +
                             "): was it written by another task?");
  }
  const torch::Tensor v = state.to(torch::kCPU, torch::kDouble).contiguous();
  const auto a = v.accessor<double, 1>();
  loss_sum_.fill_(a[0]);
  samples_ = static_cast<int64_t>(a[1]);
  restored_seconds_ = a[2];
  phases_ = PhaseTimes{a[3], a[4], a[5], a[6]};
  for (size_t i = 0; i < sums_.size(); ++i) sums_[i].fill_(a[kFixed + static_cast<int64_t>(i)]);
}

EpochResult EpochMeter::reduce(Communicator& comm, int64_t epoch, double sync_seconds) const {
  PhaseTimes local = phases_;
  local.sync += sync_seconds;
  local.forward_backward -= local.sync;  // the sync ran inside backward
  std::vector<double> values{loss_sum_.item<double>(),
                             static_cast<double>(samples_),
                             local.data,
                             local.forward_backward,
                             local.sync,
                             local.optimizer};
  for (const torch::Tensor& s : sums_) values.push_back(s.item<double>());
  torch::Tensor sums = torch::tensor(values, torch::kDouble);
  comm.all_reduce(sums, ReduceOp::Sum);
  torch::Tensor slowest =
      torch::tensor({restored_seconds_ + seconds_since(start_)}, torch::kDouble);
  comm.all_reduce(slowest, ReduceOp::Max);

  const auto s = sums.accessor<double, 1>();
  const double ranks = comm.size();
  EpochResult result;
  result.epoch = epoch;
  result.samples = static_cast<int64_t>(s[1]);
  result.train_loss = s[1] > 0 ? s[0] / s[1] : 0.0;
  result.seconds = slowest.item<double>();
  result.samples_per_sec = result.seconds > 0 ? s[1] / result.seconds : 0.0;
  result.phases = PhaseTimes{s[2] / ranks, s[3] / ranks, s[4] / ranks, s[5] / ranks};
  for (size_t i = 0; i < names_.size(); ++i) {
    result.train_metrics.push_back(Metric{names_[i], s[6 + i], result.samples});
  }
  return result;
}

}  // namespace ddp
