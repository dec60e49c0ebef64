#pragma once
/// \file
/// Gradient clipping by global norm, as torch.nn.utils.clip_grad_norm_.
///
/// The total norm is the norm_type-norm of the per-parameter gradient norms (each computed in the
/// gradient's dtype, as PyTorch does), and every gradient is multiplied by
/// min(1, max_norm / (total + 1e-6)).
///
/// With DistributedDataParallel: call it after backward (and after GradScaler::unscale_ when
/// scaling the loss), before optimizer.step(). Backward has already averaged the gradients, so
/// every rank holds the same gradients and computes the same total norm and clipping factor,
/// without communication: the replicas stay identical. Under no_sync() the gradients are local
/// (and differ between ranks); clip only after the synchronised backward that ends the
/// accumulation.

#include <torch/types.h>

#include <vector>

namespace ddp {

/// Returns the total norm of the gradients before clipping (0 when no parameter has a gradient).
/// Parameters without a gradient are skipped. `norm_type`: p >= 1, or infinity for the largest
/// absolute value. `error_if_nonfinite`: a NaN or infinite total norm is an error instead of being
/// applied (with false, as PyTorch, the gradients become NaN). std::invalid_argument for a NaN or
/// negative max_norm or an unsupported norm_type, naming them.
double clip_grad_norm(const std::vector<torch::Tensor>& parameters, double max_norm,
                      double norm_type = 2.0, bool error_if_nonfinite = false);

}  // namespace ddp
