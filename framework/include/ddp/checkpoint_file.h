#pragma once
/// \file
/// Files that are either complete or absent: written to a temporary file beside the target,
/// fsync'ed, then renamed over it, so a crash mid-write never destroys the previous file.
///
/// The temporary file is "<target>.tmp.<host>.<pid>": the writer's host and process id let a
/// later run tell a temporary file of a dead writer (removed by remove_stale_temporaries) from
/// one still being written, also on a file system shared by several hosts.

#include <torch/nn/module.h>
#include <torch/serialize/input-archive.h>

#include <cstddef>
#include <string>
#include <vector>

namespace ddp {

/// Writes the `size` bytes at `data` to `path`: temporary file, write, fsync, close, rename,
/// fsync of the directory. Every system call is checked, so a full disk is reported as such
/// (ENOSPC may surface at write, fsync or close). On any failure the temporary file is removed,
/// a previous `path` is left as it was, and std::runtime_error names `path` and the system's
/// reason, e.g. "<path>: cannot write <path>.tmp.<host>.<pid>: No space left on device (...)".
void write_atomically(const std::string& path, const void* data, std::size_t size);
/// write_atomically() of the bytes in `bytes`.
void write_atomically(const std::string& path, const std::string& bytes);

/// Creates `dir` (and its parents) if missing, then creates, writes and removes a small file in
/// it, so that a directory the run cannot write to (read-only, full, not a directory) is
/// reported before any work is done. Throws std::runtime_error naming `dir`, `what` (e.g.
/// "checkpoint directory") and the system's reason.
void check_writable_directory(const std::string& dir, const std::string& what);

/// Removes the temporary files our writer left in `dir` (not in its subdirectories) when their
/// writer is certainly gone: "<name>.tmp.<host>.<pid>" of this host whose process no longer
/// exists, and the older "<name>.tmp.<pid>" (ddp before host names) judged the same way. A file
/// of another host is removed only when nothing has written it for an hour: no write of ours
/// pauses that long, and this host cannot see that host's processes. Returns the removed paths.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

/// The module's parameters and buffers, in LibTorch's archive format (torch::load reads it).
/// Serialised in memory, then written with write_atomically: LibTorch's own file writer throws
/// from a destructor on a write error (std::terminate: "unexpected pos"), which no caller can
/// catch.
void save_module(const torch::nn::Module& module, const std::string& path);

/// Reads what save_module (or torch::save) wrote into the module's existing tensors, copying
/// values. Use it instead of torch::load once a model is wrapped in DistributedDataParallel:
/// torch::load (Module::load) swaps each parameter's storage with set_(), which gives the
/// parameter a new gradient accumulator, so the wrapper's gradient hooks would stop firing.
/// Throws std::runtime_error naming the file and the tensor that is missing or misshapen.
void load_module(torch::nn::Module& module, const std::string& path);
/// load_module() from an archive already read (a part of a larger checkpoint file).
void load_module(torch::nn::Module& module, torch::serialize::InputArchive& archive);

}  // namespace ddp
