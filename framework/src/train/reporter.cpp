#include <ddp/train/reporter.h>

#include <ddp/checkpoint_file.h>
#include <ddp/communicator.h>

#include "train/tensorboard_writer.h"
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

std::string Reporter::ranks() const { return std::to_string(group_.size()) + " rank(s)"; }

namespace {

// Whether a resumed run keeps a line of the metrics file: the epoch lines of the epochs its
// snapshot had finished and the step records up to its step. Not a JSON object: the torn end of
// a write that failed (a full disk), which the next line appended would otherwise continue.
bool kept_at_resume(const nlohmann::json& json, const ResumePoint& start) {
  if (!json.is_object()) return false;
  const auto after = [&json](const char* key, int64_t reached) {
    return json.contains(key) && json[key].is_number_integer() &&
           json[key].get<int64_t>() > reached;
  };
  if (json.contains("kind") && json["kind"] == "step") return !after("step", start.position.step);
  return !after("epoch", start.epochs_done());
}

}  // namespace

void Reporter::start_run(const ResumePoint& start) {
  counted_step_ = start.position.step;
  write_error_.clear();
  if (!group_.is_main()) return;
  tensorboard_.reset();
  if (!options_.tensorboard_dir.empty()) {
    tensorboard_ = std::make_unique<detail::TensorBoardWriter>(options_.tensorboard_dir);
    if (!options_.hparams.empty()) tensorboard_->hparams(options_.hparams);
    // TensorBoard drops what the stopped run wrote of the steps this run trains again.
    if (start.resumed()) tensorboard_->restart(start.position.step + 1);
  }
  const std::string& file = options_.metrics_file;
  if (file.empty()) return;
  if (metrics_.is_open()) metrics_.close();
  if (start.resumed()) {
    // Lines written after the snapshot by the run that stopped are dropped: this run writes
    // them again.
    std::ifstream in(file);
    std::string kept, line;
    bool dropped = false;
    while (std::getline(in, line)) {
      if (!kept_at_resume(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false),
                          start)) {
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
  recorded_ = started_;
  record_samples_ = 0;
  record_phases_ = {};
}

void Reporter::batch_done(int64_t b, const torch::Tensor& loss, int64_t samples,
                          const StepScalars& scalars) {
  samples_ += samples;
  record_samples_ += samples;
  ++counted_step_;
  if (scalars.phases) {
    record_phases_.data += scalars.phases->data;
    record_phases_.forward_backward += scalars.phases->forward_backward;
    record_phases_.sync += scalars.phases->sync;
    record_phases_.optimizer += scalars.phases->optimizer;
  }
  const int64_t interval = options_.log_interval;
  if (interval > 0 && b % interval == 0) {
    // Every rank takes part: the loss shown is the ranks' average, and so are the phase times
    // of the step record (as an epoch's are).
    torch::Tensor mean = torch::tensor(
        {loss.detach().to(torch::kCPU, torch::kDouble).item<double>(), record_phases_.data,
         record_phases_.forward_backward, record_phases_.sync, record_phases_.optimizer},
        torch::kDouble);
    group_.cpu().all_reduce(mean, ReduceOp::Avg);
    shown_loss_ = mean[0].item<double>();
    if (group_.is_main() && (metrics_.is_open() || tensorboard_)) {
      write_step_record(b, shown_loss_, mean.data_ptr<double>() + 1, scalars);
    }
    recorded_ = Clock::now();
    record_samples_ = 0;
    record_phases_ = {};
    if (mode_ == ProgressMode::Log) {
      ProgressLine line;
      line.epoch = plan_.epoch;
      line.seen = plan_.samples_before(b, group_.size());
      line.dataset_size = plan_.dataset_size;
      line.percent = plan_.percent_before(b);
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
    std::printf(
        "%s; nothing saved: no checkpoint directory (CheckpointerOptions::dir is empty) "
        "(%.2f s after the signal)\n",
        where.c_str(), stop.seconds_since_signal());
  } else {
    std::printf("%s: wrote %s %.2f s after the signal; resume from it to continue\n", where.c_str(),
                snapshot.c_str(), stop.seconds_since_signal());
  }
  std::fflush(stdout);
}

void Reporter::write_step_record(int64_t b, double loss, const double* phases,
                                 const StepScalars& scalars) {
  const double seconds = seconds_since(recorded_);
  const int64_t step = scalars.step >= 0 ? scalars.step : counted_step_;
  nlohmann::ordered_json line = {
      {"kind", "step"}, {"epoch", plan_.epoch}, {"batch", b}, {"step", step}, {"loss", loss}};
  if (scalars.lr) line["lr"] = *scalars.lr;
  if (scalars.grad_norm) line["grad_norm"] = *scalars.grad_norm;
  line["samples_per_sec"] =
      seconds > 0 ? static_cast<double>(record_samples_ * group_.size()) / seconds : 0.0;
  if (scalars.phases && seconds > 0) {
    line["data_share"] = phases[0] / seconds;
    line["forward_backward_share"] = phases[1] / seconds;
    line["sync_share"] = phases[2] / seconds;
    line["optimizer_share"] = phases[3] / seconds;
  }
  // A failed write does not end the job inside the epoch (Reporter::batch_done).
  try {
    if (metrics_.is_open()) append_metrics_line(line.dump());
    if (tensorboard_) {
      std::vector<std::pair<std::string, double>> values;
      for (const auto& [key, value] : line.items()) {
        if (value.is_number() && key != "epoch" && key != "batch" && key != "step") {
          values.emplace_back("step/" + key, value.get<double>());
        }
      }
      tensorboard_->scalars(step, values);
    }
  } catch (const std::runtime_error& e) {
    write_error_ = e.what();
    metrics_.close();
    tensorboard_.reset();
    std::fprintf(stderr, "ddp: %s; training goes on to the epoch's end, and stops there\n",
                 e.what());
    std::fflush(stderr);
  }
}

void Reporter::append_metrics_line(const std::string& text) {
  errno = 0;
  metrics_ << text << "\n" << std::flush;
  if (!metrics_) {
    // The stream keeps no reason; the failed write(2) left it in errno (ENOSPC for a full disk).
    const int error = errno;
    throw std::runtime_error(options_.metrics_file + ": cannot write the metrics file: " +
                             (error ? std::strerror(error) : "the write failed"));
  }
}

void Reporter::write_metrics(const EpochResult& r) {
  if (!group_.is_main()) return;
  if (!write_error_.empty()) throw std::runtime_error(write_error_);  // a step record's
  if (!metrics_.is_open() && !tensorboard_) return;
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
  if (metrics_.is_open()) append_metrics_line(line.dump());
  if (tensorboard_) {
    std::vector<std::pair<std::string, double>> values;
    for (const auto& [key, value] : line.items()) {
      if (value.is_number() && key != "epoch")
        values.emplace_back("epoch/" + key, value.get<double>());
    }
    tensorboard_->scalars(r.epoch, values);
  }
}

}  // namespace ddp
