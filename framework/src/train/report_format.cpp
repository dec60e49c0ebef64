// ReportFormat's generic lines and the summary table (reporter.h).
#include <ddp/train/reporter.h>

#include <algorithm>
#include <cstdio>
#include <string>

namespace ddp {

namespace {

std::string percent(double part, double whole) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f%%", whole > 0 ? 100.0 * part / whole : 0.0);
  return text;
}

// "loss 0.5267, abs_error 0.1234": the loss, then each metric's mean per sample.
std::string loss_and_metrics(double loss, const std::vector<Metric>& metrics) {
  char text[96];
  std::snprintf(text, sizeof text, "loss %.4f", loss);
  std::string line = text;
  for (const Metric& m : metrics) {
    std::snprintf(text, sizeof text, ", %s %.6g", m.name.c_str(), m.mean());
    line += text;
  }
  return line;
}

// `text` right-aligned in `width` columns, after the two spaces between columns.
std::string cell(const std::string& text, int width) {
  const size_t pad = static_cast<size_t>(std::max(0, width - static_cast<int>(text.size())));
  return "  " + std::string(pad, ' ') + text;
}

}  // namespace

std::string ReportFormat::log_line(const ProgressLine& l) const {
  char text[160];
  std::snprintf(text, sizeof text, "Epoch %lld [%lld/%lld (%.0f%%)] loss %.6f ETA %s",
                static_cast<long long>(l.epoch), static_cast<long long>(l.seen),
                static_cast<long long>(l.dataset_size), l.percent, l.loss,
                format_duration(l.eta_seconds).c_str());
  return text;
}

std::string ReportFormat::epoch_lines(const EpochResult& r, const std::string& ranks) const {
  std::string text = "\nTrain set: " + loss_and_metrics(r.train_loss, r.train_metrics) + "\n";
  if (r.test_loss) text += "Test set: " + loss_and_metrics(*r.test_loss, r.test_metrics) + "\n";
  return text + "\n" + timing_line(r, ranks) + "\n\n";
}

std::string ReportFormat::metric_heading(const std::string& set, const Metric& metric) const {
  const std::string name = set + "_" + metric.name;
  return std::string(name.size() < 10 ? 10 - name.size() : 0, ' ') + name;
}

std::string ReportFormat::metric_cell(const std::string& /*set*/, const Metric& metric,
                                      int width) const {
  char text[64];
  std::snprintf(text, sizeof text, "%*.6g", width, metric.mean());
  return text;
}

std::string ReportFormat::timing_line(const EpochResult& r, const std::string& ranks) {
  char text[320];
  std::snprintf(text, sizeof text, "Epoch %lld: %.2f s, %.0f samples/s over %s",
                static_cast<long long>(r.epoch), r.seconds, r.samples_per_sec, ranks.c_str());
  std::string line = text;
  const PhaseTimes& p = r.phases;
  if (p.data != 0 || p.forward_backward != 0 || p.sync != 0 || p.optimizer != 0) {  // timed
    line += " | data " + percent(p.data, r.seconds) + ", forward+backward " +
            percent(p.forward_backward, r.seconds) + ", gradient sync " +
            percent(p.sync, r.seconds) + ", optimizer " + percent(p.optimizer, r.seconds);
  }
  if (r.gpu_memory_peak_mb >= 0) {
    std::snprintf(text, sizeof text, " | GPU memory peak %.0f MiB", r.gpu_memory_peak_mb);
    line += text;
  }
  return line;
}

std::string ReportFormat::summary_table(const std::vector<EpochResult>& epochs) const {
  if (epochs.empty()) return "";
  // The columns follow the first epoch: every epoch of a run has the same.
  const EpochResult& first = epochs.front();
  std::vector<std::string> train_heads, test_heads;
  for (const Metric& m : first.train_metrics) train_heads.push_back(metric_heading("train", m));
  for (const Metric& m : first.test_metrics) test_heads.push_back(metric_heading("test", m));
  const auto width = [](const std::string& heading) { return static_cast<int>(heading.size()); };

  std::string table = "epoch  train loss";
  for (const std::string& h : train_heads) table += "  " + h;
  if (first.test_loss) {
    table += "  test loss";
    for (const std::string& h : test_heads) table += "  " + h;
  }
  table += "  time (s)  samples/s    sync\n";
  char text[96];
  for (const EpochResult& e : epochs) {
    std::snprintf(text, sizeof text, "%5lld  %10.4f", static_cast<long long>(e.epoch),
                  e.train_loss);
    table += text;
    for (size_t i = 0; i < train_heads.size(); ++i) {
      const Metric m = i < e.train_metrics.size() ? e.train_metrics[i] : Metric{};
      table += cell(metric_cell("train", m, width(train_heads[i])), width(train_heads[i]));
    }
    if (first.test_loss) {
      std::snprintf(text, sizeof text, "  %9.4f", e.test_loss.value_or(0.0));
      table += text;
      for (size_t i = 0; i < test_heads.size(); ++i) {
        const Metric m = i < e.test_metrics.size() ? e.test_metrics[i] : Metric{};
        table += cell(metric_cell("test", m, width(test_heads[i])), width(test_heads[i]));
      }
    }
    std::snprintf(text, sizeof text, "  %8.2f  %9.0f  %6s\n", e.seconds, e.samples_per_sec,
                  percent(e.phases.sync, e.seconds).c_str());
    table += text;
  }
  return table;
}

std::string ReportFormat::snapshot_line(const SnapshotCost& c, double run_seconds) {
  char text[256];
  std::snprintf(text, sizeof text,
                "Snapshots: %lld written (%lld inside epochs, %lld at epoch ends), %.2f s in all, "
                "mean %.1f ms, max %.1f ms",
                static_cast<long long>(c.written),
                static_cast<long long>(c.written - c.at_epoch_end),
                static_cast<long long>(c.at_epoch_end), c.seconds, 1e3 * c.mean_seconds(),
                1e3 * c.max_seconds);
  std::string line = text;
  if (run_seconds <= 0) return line;
  std::snprintf(text, sizeof text, ": %s of %.2f s of training",
                percent(c.seconds, run_seconds).c_str(), run_seconds);
  return line + text;
}

}  // namespace ddp
