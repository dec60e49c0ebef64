// libFuzzer target: the CIFAR-10 binary checks read_cifar10_file runs (data/cifar_format.h): the
// record count from the size, before anything is allocated, then the labels.
#include "train/cifar_format.h"

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = "fuzz.bin";
  try {
    const int64_t count = ddp::cifar_record_count(size, path);
    if (count < 1 || static_cast<uint64_t>(count) * ddp::kCifarRecord != size) std::abort();
    ddp::check_cifar_labels(data, count, path);
    for (int64_t i = 0; i < count; ++i) {
      if (data[i * ddp::kCifarRecord] >= ddp::kCifarClasses) std::abort();  // accepted a bad label
    }
  } catch (const std::runtime_error& e) {
    if (std::string(e.what()).rfind(path + ": ", 0) != 0) std::abort();  // names the file
  }
  return 0;
}
