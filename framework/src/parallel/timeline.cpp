#include <ddp/timeline.h>

#include <ddp/checkpoint_file.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <mutex>
#include <vector>

namespace ddp {

namespace {

// Microseconds to the nanosecond: enough for a trace, and short files.
double rounded(double us) { return std::round(us * 1000.0) / 1000.0; }

}  // namespace

struct Timeline::Impl {
  struct Event {
    std::string name;
    const char* category;
    double start_us, duration_us;  // duration < 0: an instant
    Lane lane;
  };
  explicit Impl(Communicator& c) : comm(c) {}
  double since_origin_us(Clock::time_point t) const {
    return std::chrono::duration<double, std::micro>(t - origin).count();
  }

  Communicator& comm;
  Clock::time_point origin;
  mutable std::mutex mutex;
  std::vector<Event> events;
};

Timeline::Timeline(Communicator& comm) : impl_(std::make_unique<Impl>(comm)) {
  comm.barrier();
  impl_->origin = Clock::now();
}

Timeline::~Timeline() = default;

void Timeline::span(const std::string& name, const char* category, Clock::time_point start,
                    Clock::time_point end, Lane lane) {
  const double begin = impl_->since_origin_us(start);
  const double duration = std::chrono::duration<double, std::micro>(end - start).count();
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->events.push_back(Impl::Event{name, category, begin, duration, lane});
}

void Timeline::instant(const std::string& name, const char* category, Clock::time_point at,
                       Lane lane) {
  const double begin = impl_->since_origin_us(at);
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->events.push_back(Impl::Event{name, category, begin, -1.0, lane});
}

size_t Timeline::size() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->events.size();
}

void Timeline::write(const std::string& path) {
  // Chrome's trace event format: each rank is a process, each lane a thread. Every rank sends
  // its events as JSON text; rank 0 merges them.
  Communicator& comm = impl_->comm;
  const int rank = comm.rank();
  nlohmann::json mine = nlohmann::json::array();
  {
    std::lock_guard<std::mutex> lock(impl_->mutex);
    for (const Impl::Event& e : impl_->events) {
      nlohmann::json event = {{"name", e.name},
                              {"cat", e.category},
                              {"pid", rank},
                              {"tid", static_cast<int>(e.lane)},
                              {"ts", rounded(e.start_us)}};
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
  const std::vector<std::string> all = all_gather_strings(comm, mine.dump());
  if (rank != 0) return;
  nlohmann::json events = nlohmann::json::array();
  events.push_back({{"name", "timeline"},
                    {"ph", "M"},
                    {"pid", 0},
                    {"tid", 0},
                    {"args", nlohmann::json::object()}});
  for (int r = 0; r < static_cast<int>(all.size()); ++r) {
    events.push_back({{"name", "process_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"args", {{"name", "rank " + std::to_string(r)}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 0},
                      {"args", {{"name", "training"}}}});
    events.push_back({{"name", "thread_name"},
                      {"ph", "M"},
                      {"pid", r},
                      {"tid", 1},
                      {"args", {{"name", "communication"}}}});
    for (auto& event : nlohmann::json::parse(all[r])) events.push_back(std::move(event));
  }
  const nlohmann::json trace = {{"displayTimeUnit", "ms"}, {"traceEvents", std::move(events)}};
  write_atomically(path, trace.dump(0) + "\n");
}

}  // namespace ddp
