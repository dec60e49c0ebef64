#pragma once
// Files that are either complete or absent: written to a temporary file beside the target,
// fsync'ed, then renamed over it, so a crash mid-write never destroys the previous file.

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

#include <functional>
#include <string>

namespace ddp {

// Calls write(temporary_path), then makes the result durable and renames it to `path`. Throws
// std::runtime_error naming the file on any failure and removes the temporary file.
void write_atomically(const std::string& path,
                      const std::function<void(const std::string&)>& write);

// The module's parameters and buffers, in LibTorch's archive format (torch::load reads it).
void save_module(const torch::nn::Module& module, const std::string& path);

// Reads what save_module (or torch::save) wrote into the module's existing tensors, copying
// values. Use it instead of torch::load once a model is wrapped in DistributedDataParallel:
// torch::load (Module::load) swaps each parameter's storage with set_(), which gives the
// parameter a new gradient accumulator, so the wrapper's gradient hooks would stop firing.
// Throws std::runtime_error naming the file and the tensor that is missing or misshapen.
void load_module(torch::nn::Module& module, const std::string& path);
void load_module(torch::nn::Module& module, torch::serialize::InputArchive& archive);

}  // namespace ddp
