#include <ddp/timeline.h>

#include <ddp/checkpoint.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace ddp {

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
  const int rank = comm_.rank();
  std::ostringstream mine;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    char number[64];
    for (const Event& e : events_) {
      mine << ",\n{\"name\": \"" << e.name << "\", \"cat\": \"" << e.category
           << "\", \"pid\": " << rank << ", \"tid\": " << e.lane;
      std::snprintf(number, sizeof number, "%.3f", e.start_us);
      mine << ", \"ts\": " << number;
      if (e.duration_us >= 0) {
        std::snprintf(number, sizeof number, "%.3f", e.duration_us);
        mine << ", \"ph\": \"X\", \"dur\": " << number << "}";
      } else {
        mine << ", \"ph\": \"i\", \"s\": \"t\"}";
      }
    }
  }
  const std::vector<std::string> all = all_gather_strings(comm_, mine.str());
  if (rank != 0) return;
  write_atomically(path, [&](const std::string& tmp) {
    std::ofstream out(tmp);
    out << "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n"
        << "{\"name\": \"timeline\", \"ph\": \"M\", \"pid\": 0, \"tid\": 0, \"args\": {}}";
    for (int r = 0; r < static_cast<int>(all.size()); ++r) {
      out << ",\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " << r
          << ", \"args\": {\"name\": \"rank " << r << "\"}}"
          << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << r
          << ", \"tid\": 0, \"args\": {\"name\": \"training\"}}"
          << ",\n{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " << r
          << ", \"tid\": 1, \"args\": {\"name\": \"communication\"}}";
      out << all[r];
    }
    out << "\n]}\n";
    if (!out) throw std::runtime_error(tmp + ": write failed");
  });
}

}  // namespace ddp
