#include <ddp/train/step_boundary.h>

#include <ddp/communicator.h>
#include <ddp/train/divergence.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace ddp {

namespace {

int64_t checked_every(int64_t every, const Checkpointer& checkpointer) {
  if (every == 0 && checkpointer.options().every_seconds > 0) {
    // The ranks agree on a timed snapshot at the stop check.
    throw std::invalid_argument(
        "CheckpointerOptions::every_seconds needs stop checks "
        "(StepBoundary's stop_check_every > 0): the ranks agree on a "
        "timed snapshot there");
  }
  return every;  // StopAgreement refuses a negative one
}

}  // namespace

EpochLength epoch_length(int64_t batches, int64_t limit, int64_t accumulate) {
  if (batches < 0 || limit < 0 || accumulate < 1) {
    throw std::invalid_argument(
        "epoch_length: needs batches >= 0, limit >= 0, accumulate >= 1 (got " +
        std::to_string(batches) + ", " + std::to_string(limit) + ", " + std::to_string(accumulate) +
        ")");
  }
  EpochLength length;
  length.batches = limit > 0 ? std::min(batches, limit) : batches;
  length.steps = (length.batches + accumulate - 1) / accumulate;
  return length;
}

StepBoundary::StepBoundary(ProcessGroup& group, Checkpointer checkpointer, int64_t stop_check_every)
    : group_(group),
      stop_(group, checked_every(stop_check_every, checkpointer)),
      checkpointer_(std::move(checkpointer)) {
  resume_.seed = checkpointer_.options().seed;
}

const ResumePoint& StepBoundary::resume(torch::optim::LRScheduler* scheduler) {
  resume_ = checkpointer_.resume(scheduler);
  return resume_;
}

EpochStart StepBoundary::start_epoch(int64_t epoch, DistributedSampler& sampler,
                                     int64_t batch_size) {
  epoch_ = EpochStart{};
  batch_size_ = batch_size;
  position_ = TrainingPosition{epoch, 0, position_.step, 0};
  TrainingPosition& at = resume_.position;
  if (epoch != at.epoch || at.batch == 0) {
    sampler.set_epoch(epoch);
    return epoch_;
  }
  // The resumed epoch, once: a later start of it begins at its beginning.
  const int64_t batch = std::exchange(at.batch, 0);
  const int64_t samples = std::exchange(at.samples, -1);
  // Empty at another world size (Checkpointer::resume).
  epoch_.rank_state = std::exchange(resume_.rank_state, RankState{});
  const bool moved = resume_.world_size != group_.size() ||
                     (resume_.batch_size > 0 && resume_.batch_size != batch_size);
  if (!moved ||
      samples < 0) {  // each rank continues its own shard (load_snapshot refused the rest)
    sampler.set_epoch(epoch);
    epoch_.first_batch = batch;
    return epoch_;
  }
  // The rest of the epoch's order, re-sharded over this run's ranks, counted on from the
  // snapshot's batch.
  if (samples >= sampler.dataset_size()) {
    throw std::runtime_error(
        resume_.path + ": records " + std::to_string(samples) + " samples of epoch " +
        std::to_string(epoch) + " trained, but the training set has " +
        std::to_string(sampler.dataset_size()) + ": resume with the training set that wrote it");
  }
  sampler.set_epoch(epoch, samples);
  epoch_.first_batch = epoch_.sampler_offset = batch;
  epoch_.sampler_start = samples;
  say_uneven_rest(epoch, sampler);
  return epoch_;
}

void StepBoundary::say_uneven_rest(int64_t epoch, const DistributedSampler& sampler) const {
  const int64_t rest = sampler.dataset_size() - sampler.start();
  const int64_t shared = sampler.total_size();
  if (shared == rest || !group_.is_main()) return;
  // The sampler shares the rest as it shares a whole epoch, index for index PyTorch's
  // DistributedSampler: padded to a multiple of the ranks by repeating its first samples, or
  // cut with drop_last.
  const std::string what =
      shared > rest ? std::to_string(shared - rest) +
                          " position(s) repeat samples of the rest, as DistributedSampler pads"
                    : std::to_string(rest - shared) +
                          " sample(s) of the rest are left out, as DistributedSampler with "
                          "drop_last cuts";
  std::printf(
      "The rest of epoch %lld, %lld samples from position %lld of its order, is shared over %d "
      "ranks as %lld each: %s an epoch that does not divide among the ranks (as PyTorch's)\n",
      static_cast<long long>(epoch), static_cast<long long>(rest),
      static_cast<long long>(sampler.start()), group_.size(),
      static_cast<long long>(sampler.num_samples()), what.c_str());
  std::fflush(stdout);
}

StepBoundary::~StepBoundary() {
  if (!in_flight_) return;
  try {
    in_flight_->wait();
  } catch (const std::exception&) {  // the collective's failure is reported where it is waited for
  }
}

torch::Tensor StepBoundary::values(int64_t nonfinite_loss_step) const {
  const std::array<double, StopAgreement::kValues> stop = stop_.values();
  std::vector<double> values(stop.begin(), stop.end());
  // The non-finite loss: the highest rank and, negated so that Max finds it, the earliest step.
  const bool nonfinite = nonfinite_loss_step >= 0;
  values.push_back(nonfinite ? double(group_.rank()) : -1.0);
  values.push_back(nonfinite ? -double(nonfinite_loss_step) : -1e300);
  values.push_back(checkpointer_.time_due() ? 1.0 : 0.0);
  return torch::tensor(values, torch::kDouble);
}

bool StepBoundary::read(const torch::Tensor& agreed) {
  stop_.decide(agreed.data_ptr<double>());
  refuse_nonfinite(agreed);
  return agreed.data_ptr<double>()[StopAgreement::kValues + 2] > 0;
}

void StepBoundary::refuse_nonfinite(const torch::Tensor& agreed) const {
  const double* v = agreed.data_ptr<double>() + StopAgreement::kValues;
  if (v[0] < 0) return;
  const int64_t first = static_cast<int64_t>(-v[1]);
  throw TrainingDiverged("the loss of rank " + std::to_string(static_cast<int>(v[0])) +
                             " was not finite (first at step " + std::to_string(first) + ")",
                         first, position_.epoch);
}

bool StepBoundary::at_step(int64_t batch, int64_t step,
                           const std::function<RankState()>& rank_state,
                           int64_t nonfinite_loss_step) {
  const int64_t samples =
      epoch_.sampler_start + epoch_.sampler_batch(batch) * batch_size_ * group_.size();
  position_ = TrainingPosition{position_.epoch, batch, step, samples};
  snapshot_.clear();
  bool time_due = false;
  if (in_flight_) {  // it ran during the step since
    std::exchange(in_flight_, nullptr)->wait();
    time_due = read(sent_);
  }
  const int64_t every = stop_.every();
  const bool check = every > 0 && step % every == 0;
  if (every > 0 &&
      (stop_.stopping() || checkpointer_.due(position_, time_due) || (check && !sent_.defined()))) {
    // A snapshot is written here, or this is the first check (a signal during the start-up
    // stops the ranks before any step): this boundary's values are agreed now, waiting.
    sent_ = values(nonfinite_loss_step);
    group_.cpu().all_reduce(sent_, ReduceOp::Max);
    time_due = read(sent_) || time_due;
  } else if (check) {
    sent_ = values(nonfinite_loss_step);
    in_flight_ = group_.cpu().all_reduce_async(sent_, ReduceOp::Max);
  }
  const bool stopping = stop_.stopping();
  snapshot_ = checkpointer_.at_boundary(stopping, position_, rank_state, time_due);
  return stopping;
}

void StepBoundary::end_epoch(int64_t nonfinite_loss_step) {
  if (stop_.every() == 0) return;
  // What the agreement in flight sends, these values send again: a stop signal stays set until
  // the ranks stop, and the first non-finite step stays the first.
  if (in_flight_) std::exchange(in_flight_, nullptr)->wait();
  torch::Tensor now = values(nonfinite_loss_step);
  group_.cpu().all_reduce(now, ReduceOp::Max);
  refuse_nonfinite(now);
  // The next epoch's first check agrees at once, as the run's first does: a signal sent in this
  // epoch's last steps stops the ranks before the next epoch's first batch, with a snapshot there
  // (not before this epoch's own snapshot, which the loop writes next).
  sent_ = torch::Tensor();
}

void StepBoundary::end_run(int64_t last_epoch) {
  if (in_flight_) std::exchange(in_flight_, nullptr)->wait();
  const std::string& written = checkpointer_.last_written();
  if (group_.is_main() && resume_.resumed() && resume_.position.epoch > last_epoch) {
    std::printf(
        "Nothing left to train: %s is the end of epoch %lld (step %lld), and this run ends at "
        "epoch %lld: the run is complete; give more epochs to train on\n",
        resume_.path.c_str(), static_cast<long long>(resume_.epochs_done()),
        static_cast<long long>(resume_.position.step), static_cast<long long>(last_epoch));
    std::fflush(stdout);
  }
  if (stop_.every() == 0 || stop_.stopping()) return;
  const std::array<double, StopAgreement::kValues> mine = stop_.values();
  torch::Tensor agreed =
      torch::tensor(std::vector<double>(mine.begin(), mine.end()), torch::kDouble);
  group_.cpu().all_reduce(agreed, ReduceOp::Max);
  const double* v = agreed.data_ptr<double>();
  if (v[0] <= 0 || !group_.is_main()) return;
  const std::string saved = !written.empty()    ? "saved " + written
                            : resume_.resumed() ? "saved " + resume_.path
                            : checkpointer_.options().dir.empty()
                                ? "nothing saved: no checkpoint directory"
                                : "nothing saved";
  std::printf(
      "%s (rank %d) came after the run's last step: the run is complete (%s); nothing is left "
      "to resume\n",
      stop_signal_name(static_cast<int>(v[0])), static_cast<int>(v[1]), saved.c_str());
  std::fflush(stdout);
}

}  // namespace ddp
