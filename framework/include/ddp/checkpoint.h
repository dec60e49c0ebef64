#pragma once
// Files that are either complete or absent: written to a temporary file beside the target,
// fsync'ed, then renamed over it, so a crash mid-write never destroys the previous file.

#include <torch/nn/module.h>

#include <functional>
#include <string>

namespace ddp {

// Calls write(temporary_path), then makes the result durable and renames it to `path`. Throws
// std::runtime_error naming the file on any failure and removes the temporary file.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// The module's parameters and buffers, in LibTorch's archive format (torch::load reads it).
void save_module(const torch::nn::Module& module, const std::string& path);

}  // namespace ddp
