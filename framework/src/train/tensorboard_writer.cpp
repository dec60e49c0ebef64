#include "train/tensorboard_writer.h"

#include "util/hash.h"
#include "util/host_name.h"

#include <tensorboard_event.pb.h>  // protoc's, from tensorboard_event.proto (in the build tree)

#include <boost/crc.hpp>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <system_error>

#include <fcntl.h>
#include <unistd.h>

namespace ddp::detail {

namespace {

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// A number when the whole text is one (strtod), else nothing.
bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  errno = 0;
  value = std::strtod(text.c_str(), &end);
  return errno == 0 && end == text.c_str() + text.size() && std::isfinite(value);
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  return crc.checksum();
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string frame_record(const std::string& payload) {
  std::string record;
  record.reserve(payload.size() + 16);
  put_le(record, payload.size(), 8);
  put_le(record, masked_crc32c(record.data(), 8), 4);
  record += payload;
  put_le(record, masked_crc32c(payload.data(), payload.size()), 4);
  return record;
}

TensorBoardWriter::TensorBoardWriter(const std::string& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) {
    throw std::runtime_error(dir + ": cannot create the TensorBoard folder: " + error.message());
  }
  const double now = unix_seconds();
  const std::string base = (std::filesystem::path(dir) /
                            ("events.out.tfevents." + std::to_string(static_cast<int64_t>(now)) +
                             "." + detail::host_name()))
                               .string();
  // O_EXCL: never append to (or truncate) another run's file of the same second.
  for (int n = 0; fd_ < 0; ++n) {
    path_ = n == 0 ? base : base + "." + std::to_string(n);
    fd_ = ::open(path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0 && (errno != EEXIST || n >= 100)) {
      throw std::runtime_error(
          path_ + ": cannot open the TensorBoard event file for writing: " + std::strerror(errno));
    }
  }
  tensorboard::Event event;
  event.set_wall_time(now);
  event.set_file_version("brain.Event:2");
  write(event.SerializeAsString());
}

TensorBoardWriter::~TensorBoardWriter() {
  if (fd_ >= 0) ::close(fd_);
}

void TensorBoardWriter::write(const std::string& event) {
  const std::string record = frame_record(event);
  size_t done = 0;
  while (done < record.size()) {
    const ssize_t n = ::write(fd_, record.data() + done, record.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int reason = n < 0 ? errno : ENOSPC;
      throw std::runtime_error(
          path_ + ": cannot write the TensorBoard event file: " + std::strerror(reason));
    }
    done += static_cast<size_t>(n);
  }
}

void TensorBoardWriter::scalars(int64_t step,
                                const std::vector<std::pair<std::string, double>>& values) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  tensorboard::Summary* summary = event.mutable_summary();
  for (const auto& [tag, value] : values) {
    tensorboard::Summary::Value* v = summary->add_value();
    v->set_tag(tag);
    v->set_simple_value(static_cast<float>(value));
  }
  write(event.SerializeAsString());
}

void TensorBoardWriter::restart(int64_t step) {
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  event.set_step(step);
  event.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write(event.SerializeAsString());
}

void TensorBoardWriter::hparams(const std::vector<std::pair<std::string, std::string>>& values) {
  tensorboard::HParamsPluginData data;
  data.set_version(0);
  tensorboard::SessionStartInfo* start = data.mutable_session_start_info();
  start->set_start_time_secs(unix_seconds());
  for (const auto& [name, text] : values) {
    google::protobuf::Value& value = (*start->mutable_hparams())[name];
    double number = 0;
    if (text == "true" || text == "false") {
      value.set_bool_value(text == "true");
    } else if (parse_number(text, number)) {
      value.set_number_value(number);
    } else {
      value.set_string_value(text);
    }
  }
  tensorboard::Event event;
  event.set_wall_time(unix_seconds());
  tensorboard::Summary::Value* v = event.mutable_summary()->add_value();
  v->set_tag("_hparams_/session_start_info");
  tensorboard::SummaryMetadata::PluginData* plugin = v->mutable_metadata()->mutable_plugin_data();
  plugin->set_plugin_name("hparams");
  plugin->set_content(data.SerializeAsString());
  write(event.SerializeAsString());
}

}  // namespace ddp::detail
