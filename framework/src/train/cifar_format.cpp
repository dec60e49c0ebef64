#include "train/cifar_format.h"

#include "util/file_error.h"

#include <stdexcept>

namespace ddp {

using detail::throw_file_error;

namespace {}  // namespace

int64_t cifar_record_count(uint64_t file_bytes, const std::string& path) {
  if (file_bytes == 0) throw_file_error(path, "empty file (expected 3073-byte CIFAR-10 records)");
  const uint64_t record = static_cast<uint64_t>(kCifarRecord);
  if (file_bytes % record != 0) {
    throw_file_error(path, "size " + std::to_string(file_bytes) +
                               " bytes is not a whole number of " + std::to_string(record) +
                               "-byte CIFAR-10 records (remainder " +
                               std::to_string(file_bytes % record) + ")");
  }
  return static_cast<int64_t>(file_bytes / record);
}

void check_cifar_labels(const uint8_t* records, int64_t count, const std::string& path) {
  for (int64_t i = 0; i < count; ++i) {
    const int label = records[i * kCifarRecord];
    if (label >= kCifarClasses) {
      throw_file_error(path, "record " + std::to_string(i) + " has label " + std::to_string(label) +
                                 " outside 0..9");
    }
  }
}

}  // namespace ddp
