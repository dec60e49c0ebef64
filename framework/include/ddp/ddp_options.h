#pragma once
// How DistributedDataParallel synchronises gradients.

#include <string>

namespace ddp {

class Timeline;

enum class GradSync {
  Bucketed,      // flat buckets all-reduced on a communication thread while backward runs
  PerParameter,  // one blocking all-reduce per parameter inside backward (baseline)
};

// What travels on the wire; buckets are cast for the all-reduce and cast back.
enum class Compression { None, Fp16, Bf16 };

struct DDPOptions {
  GradSync sync = GradSync::Bucketed;
  double bucket_cap_mb = 25.0;   // PyTorch's defaults
  double first_bucket_mb = 1.0;  // small, so communication starts early in backward
  // false: a parameter without a gradient on some rank is an error naming it and the rank.
  // true: such gradients count as zero on that rank (every step pays a check either way).
  bool find_unused_parameters = false;
  Compression compression = Compression::None;
  Timeline* timeline = nullptr;  // records each bucket's all-reduce when set
};

// Parses "bucketed" / "per-parameter" and "none" / "fp16" / "bf16"; throws
// std::invalid_argument naming the value otherwise.
GradSync parse_grad_sync(const std::string& name);
Compression parse_compression(const std::string& name);

}  // namespace ddp
