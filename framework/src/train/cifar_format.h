#pragma once
// CIFAR-10's binary format as pure functions on sizes and bytes, so that read_cifar10_file and
// the libFuzzer target (fuzz/fuzz_cifar.cpp, built by clang without LibTorch) check the same
// code: a file is whole 3073-byte records, each 1 label byte (0..9) then 3x32x32 pixels.

#include <cstddef>
#include <cstdint>
#include <string>

namespace ddp {

inline constexpr int64_t kCifarChannels = 3;
inline constexpr int64_t kCifarSide = 32;
inline constexpr int64_t kCifarPixels = kCifarChannels * kCifarSide * kCifarSide;
inline constexpr int64_t kCifarRecord = 1 + kCifarPixels;
inline constexpr int kCifarClasses = 10;

// The number of records in a file of `file_bytes` bytes, known before anything is allocated.
// Throws std::runtime_error naming `path` when the file is empty or not whole records.
int64_t cifar_record_count(uint64_t file_bytes, const std::string& path);

// Checks the label byte of each of `count` records at `records` (count * kCifarRecord bytes).
// Throws std::runtime_error naming `path`, the record and the label when one is above 9.
void check_cifar_labels(const uint8_t* records, int64_t count, const std::string& path);

}  // namespace ddp
