#pragma once
// How DistributedDataParallel synchronises gradients.

#include <c10/core/Device.h>

#include <string>

namespace ddp {

class Timeline;

enum class GradSync {
  Bucketed,      // flat buckets all-reduced while backward runs
  PerParameter,  // one bucket per parameter (the baseline; same code path, other bucket caps)
};

// What travels on the wire; buckets are cast for the all-reduce and cast back.
enum class Compression { None, Fp16, Bf16 };

// Who all-reduces the gradients and broadcasts parameters and buffers. Auto: NCCL when the
// parameters are on this rank's GPU and the build has the NCCL communicator, MPI otherwise
// (resolve_backend below).
enum class Backend { Auto, Mpi, Nccl };

struct DDPOptions {
  GradSync sync = GradSync::Bucketed;
  double bucket_cap_mb = 25.0;   // PyTorch's defaults
  double first_bucket_mb = 1.0;  // small, so communication starts early in backward
  // false: a parameter without a gradient on some rank is an error naming it and the rank.
  // true: such gradients count as zero on that rank (every step pays a check either way).
  bool find_unused_parameters = false;
  Compression compression = Compression::None;
  Backend backend = Backend::Auto;
  // true: prepare_forward() broadcasts rank 0's buffers (BatchNorm running statistics), as PyTorch
  // DDP does before every forward, so every replica evaluates and checkpoints the same model.
  bool broadcast_buffers = true;
  // true: after the first synchronised backward, buckets are regrouped (same caps) in the order
  // rank 0 saw gradients arrive, as PyTorch's Reducer does. Reverse registration order only
  // guesses that order; where it guesses wrong, a bucket waits for its latest gradient and its
  // all-reduce overlaps less of backward. Bucketed sync only (per-parameter buckets gain nothing).
  bool rebuild_buckets = true;
  Timeline* timeline = nullptr;  // records each bucket's all-reduce when set
};

// Parses "bucketed" / "per-parameter", "none" / "fp16" / "bf16" and "auto" / "mpi" / "nccl";
// throws std::invalid_argument naming the value otherwise.
GradSync parse_grad_sync(const std::string& name);
Compression parse_compression(const std::string& name);
Backend parse_backend(const std::string& name);
// The names the parsers accept, for messages and logs.
const char* grad_sync_name(GradSync sync);
const char* compression_name(Compression compression);
const char* backend_name(Backend backend);

// The backend for parameters on `params_device`, with Backend::Auto resolved: NCCL when they are
// on `rank_device` (Runtime::device()), a CUDA device, and `nccl_built`
// (nccl_communicator_built()); MPI otherwise. Throws std::invalid_argument naming
// DDPOptions::backend when `requested` is Nccl and that cannot work. Pure.
Backend resolve_backend(Backend requested, c10::Device params_device, c10::Device rank_device,
                        bool nccl_built);

}  // namespace ddp
