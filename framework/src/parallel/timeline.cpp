#include <ddp/parallel/timeline.h>

#include <ddp/util/checkpoint.h>

#include <nlohmann/json.hpp>

#include <cmath>

namespace ddp {

namespace {

// Microseconds to the nanosecond: enough for a trace, and short files.
double rounded(double us) { return std::round(us * 1000.0) / 1000.0; }

}  // namespace

Timeline::Timeline(Communicator& comm) : comm_(comm) {
  comm_.barrier();
  origin_ = Clock::now();
}

double Timeline::since_origin_us(Clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - origin_).count();
}

void Timeline::span(const std::string& name, const char* category, Clock::time_point start,
                    Clock::time_point end, Lane lane) {
  const double begin = since_origin_us(start);
  const double duration = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(Event{name, category, begin, duration, lane});
}

void Timeline::instant(const std::string& name, const char* category, Clock::time_point at,
                       Lane lane) {
  const double begin = since_origin_us(at);
  std::lock_guard<std::mutex> lock(mutex_);
  events_.push_back(Event{name, category, begin, -1.0, lane});
}

size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return events_.size();
}

void Timeline::write(const std::string& path) {
  // Chrome's trace event format: each rank is a process, each lane a thread. Every rank sends
  // its events as JSON text; rank 0 merges them.
  const int rank = comm_.rank();
  nlohmann::json mine = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (const Event& e : events_) {
      nlohmann::json event = {{"name", e.name}, {"cat", e.category}, {"pid", rank},
                              {"tid", static_cast<int>(e.lane)}, {"ts", rounded(e.start_us)}};
      if (e.duration_us >= 0) {
        event["ph"] = "X";
        event["dur"] = rounded(e.duration_us);
      } else {
        event["ph"] = "i";
        event["s"] = "t";
      }
      mine.push_back(std::move(event));
    }
  }
  const std::vector<std::string> all = all_gather_strings(comm_, mine.dump());
  if (rank != 0) return;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "timeline"}, {"ph", "M"}, {"pid", 0}, {"tid", 0}, {"args", nlohmann::json::object()}});
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    events.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 0},
                      {"args", {{"name", "training"}}}});
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", r}, {"tid", 1},
                      {"args", {{"name", "communication"}}}});
    for (auto& event : nlohmann::json::parse(all[r])) events.push_back(std::move(event));
  }
  const nlohmann::json trace = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  write_atomically(path, trace.dump(0) + "\n");
}

}  // namespace ddp
