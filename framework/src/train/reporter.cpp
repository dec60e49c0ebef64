#include <ddp/train/reporter.h>

#include <ddp/checkpoint_file.h>
#include <ddp/communicator.h>

#include "util/clock.h"

#include <nlohmann/json.hpp>

#include <torch/torch.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace ddp {

Reporter::Reporter(ProcessGroup& group, ReporterOptions options)
    : group_(group),
      options_(std::move(options)),
      format_(options_.format ? options_.format : std::make_shared<const ReportFormat>()),
      mode_(group.is_main() ? resolve_progress_mode(options_.progress) : ProgressMode::None) {
  if (options_.log_interval < 0) {
    throw std::invalid_argument("ReporterOptions::log_interval must be >= 0 (got " +
                                std::to_string(options_.log_interval) + ")");
  }
}

Reporter::~Reporter() = default;

std::string Reporter::ranks() const {
  return std::to_string(group_.size()) + " rank(s)";
}

void Reporter::start_run(const ResumePoint& start) {
  const std::string& file = options_.metrics_file;
  if (!group_.is_main() || file.empty()) return;
  if (metrics_.is_open()) metrics_.close();
  if (start.resumed()) {
    // Keep the lines of the epochs the snapshot had finished, drop any of later epochs (written
    // after the snapshot by the run that stopped; this run trains them again) and any that is
    // not a JSON object: the torn end of a write that failed (a full disk), which the next line
    // appended would otherwise continue.
    std::ifstream in(file);
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      const auto json = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (!json.is_object() || (json.contains("epoch") && json["epoch"].is_number_integer() &&
                                json["epoch"].get<int64_t>() > start.epochs_done())) {
        dropped = true;
        continue;
      }
      kept += line + "\n";
    }
    if (dropped) write_atomically(file, kept);  // names the file and errno's reason on failure
  }
  errno = 0;
  metrics_.open(file, start.resumed() ? std::ios::app : std::ios::trunc);
  if (!metrics_) {
    // The stream keeps no reason; the failed open(2) left it in errno (ENOENT for a missing
    // folder, EISDIR, EACCES).
    const int error = errno;
    throw std::runtime_error(file + ": cannot open the metrics file for writing: " +
                             (error ? std::strerror(error) : "the open failed"));
  }
}

void Reporter::start_epoch(const EpochPlan& plan) {
  plan_ = plan;
  started_ = Clock::now();
  drawn_ = {};
  samples_ = 0;
  shown_loss_ = -1;
  bar_drawn_ = false;
}

void Reporter::batch_done(int64_t b, const torch::Tensor& loss, int64_t samples) {
  samples_ += samples;
  const int64_t interval = options_.log_interval;
  if (interval > 0 && b % interval == 0) {
    // Every rank takes part: the loss shown is the ranks' average.
    torch::Tensor mean = loss.detach().to(torch::kCPU, torch::kDouble).reshape({1});
    group_.cpu().all_reduce(mean, ReduceOp::Avg);
    shown_loss_ = mean.item<double>();
    if (mode_ == ProgressMode::Log) {
      ProgressLine line;
      line.epoch = plan_.epoch;
      line.seen = b * plan_.batch_size * group_.size();
      line.dataset_size = plan_.dataset_size;
      line.percent = plan_.batches_per_epoch > 0
                         ? 100.0 * static_cast<double>(b) / static_cast<double>(plan_.batches_per_epoch)
                         : 0.0;
      line.loss = shown_loss_;
      line.eta_seconds = eta_seconds(seconds_since(started_), b + 1 - plan_.first_batch,
                                     plan_.batches - plan_.first_batch);
      std::printf("%s\n", format_->log_line(line).c_str());
      std::fflush(stdout);
    }
  }
  // The bar: redrawn in place at most 10 times a second, and after the last batch.
  if (mode_ == ProgressMode::Bar &&
      (b + 1 == plan_.batches || Clock::now() - drawn_ >= std::chrono::milliseconds(100))) {
    drawn_ = Clock::now();
    const double elapsed = seconds_since(started_);
    const double rate = elapsed > 0 ? static_cast<double>(samples_ * group_.size()) / elapsed : 0.0;
    const std::string line = format_progress_bar(plan_.epoch, b + 1, plan_.batches, rate,
                                                 shown_loss_, elapsed, terminal_width());
    std::printf("\r%s\033[K", line.c_str());
    std::fflush(stdout);
    bar_drawn_ = true;
  }
}

void Reporter::end_epoch() {
  if (!bar_drawn_) return;
  std::printf("\n");
  std::fflush(stdout);
  bar_drawn_ = false;
}

void Reporter::epoch_done(const EpochResult& result) {
  print_epoch(result);
  write_metrics(result);
}

void Reporter::print_epoch(const EpochResult& result) {
  if (!group_.is_main()) return;
  std::printf("%s", format_->epoch_lines(result, ranks()).c_str());
  std::fflush(stdout);
}

void Reporter::end_run(const std::vector<EpochResult>& epochs, const SnapshotCost& snapshots,
                       double run_seconds) {
  if (!group_.is_main()) return;
  if (!epochs.empty()) {
    std::printf("Summary over %s:\n%s", ranks().c_str(), format_->summary_table(epochs).c_str());
  }
  if (snapshots.written > 0) {
    std::printf("%s\n", ReportFormat::snapshot_line(snapshots, run_seconds).c_str());
  }
  std::fflush(stdout);
}

void Reporter::stopped(const StopAgreement& stop, const TrainingPosition& at,
                       const std::string& snapshot) {
  end_epoch();
  if (!group_.is_main()) return;
  const std::string where = "Stopped by " + stop.describe() + " before batch " +
                            std::to_string(at.batch) + " of epoch " + std::to_string(at.epoch) +
                            " (step " + std::to_string(at.step) + ")";
  // From the signal to the check (on the rank that got it), then the snapshot.
  if (snapshot.empty()) {
    std::printf("%s; nothing saved: no checkpoint directory (CheckpointerOptions::dir is empty) "
                "(%.2f s after the signal)\n",
                where.c_str(), stop.seconds_since_signal());
  } else {
    std::printf("%s: wrote %s %.2f s after the signal; resume from it to continue\n",
                where.c_str(), snapshot.c_str(), stop.seconds_since_signal());
  }
  std::fflush(stdout);
}

void Reporter::write_metrics(const EpochResult& r) {
  if (!group_.is_main() || !metrics_.is_open()) return;
  // Each metric's mean per sample beside the loss of its set.
  nlohmann::ordered_json line = {{"epoch", r.epoch}, {"train_loss", r.train_loss}};
  for (const Metric& m : r.train_metrics) line["train_" + m.name] = m.mean();
  if (r.test_loss) line["test_loss"] = *r.test_loss;
  for (const Metric& m : r.test_metrics) line["test_" + m.name] = m.mean();
  line["samples_per_sec"] = r.samples_per_sec;
  line["seconds"] = r.seconds;
  line["samples"] = r.samples;
  line["ranks"] = group_.size();
  line["data_seconds"] = r.phases.data;
  line["forward_backward_seconds"] = r.phases.forward_backward;
  line["sync_seconds"] = r.phases.sync;
  line["optimizer_seconds"] = r.phases.optimizer;
  if (r.gpu_memory_peak_mb >= 0) line["gpu_memory_peak_mb"] = r.gpu_memory_peak_mb;
  errno = 0;
  metrics_ << line.dump() << "\n" << std::flush;
  if (!metrics_) {
    // The stream keeps no reason; the failed write(2) left it in errno (ENOSPC for a full disk).
    const int error = errno;
    throw std::runtime_error(options_.metrics_file + ": cannot write the metrics file: " +
                             (error ? std::strerror(error) : "the write failed"));
  }
}

}  // namespace ddp
