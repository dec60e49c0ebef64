#pragma once
/// \file
/// Mixed precision for the forward pass: while an Autocast lives, the operations LibTorch's
/// autocast lists run in the lower precision on that device type (matrix products, convolutions)
/// and the precision-sensitive ones in fp32 (losses, softmax, norms), exactly as inside Python's
/// `with torch.autocast(device_type, dtype=...)`: the same thread-local switches of ATen, set and
/// restored the same way (nesting counted, cast cache cleared when the outermost guard ends).
///
///   {
///     ddp::Autocast autocast(runtime.device().type(), torch::kBFloat16);
///     loss = loss_fn(model(inputs), targets);
///   }
///   loss.backward();   // outside, as in PyTorch: backward runs each op in its forward's dtype
///
/// bf16 keeps fp32's exponent range and needs no loss scaling; fp16 (mostly for GPUs) needs
/// GradScaler (grad_scaler.h). Parameters and gradients stay fp32. Autocast state is per
/// thread: a guard covers the forward of the thread that made it.

#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <string>

namespace ddp {

/// The training precisions of the examples' --amp and TrainerOptions: "off", "bf16", "fp16".
enum class AmpMode { Off, Bf16, Fp16 };
std::string amp_mode_name(AmpMode mode);          ///< "off", "bf16" or "fp16"
AmpMode parse_amp_mode(const std::string& text);  ///< std::invalid_argument naming the text

/// The scope guard of torch.autocast (see the file's text): sets ATen's autocast state of
/// `device_type` for its lifetime, on this thread, and restores the previous state when it ends.
class Autocast {
 public:
  /// `dtype`: torch::kBFloat16 or torch::kHalf. `enabled` false: autocast is off inside, as with
  /// torch.autocast(..., enabled=False) (a region in fp32 within an autocast one).
  /// std::invalid_argument for another dtype or a device type autocast does not support.
  explicit Autocast(c10::DeviceType device_type, c10::ScalarType dtype = c10::kBFloat16,
                    bool enabled = true);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  c10::DeviceType device_type_;
  bool was_enabled_ = false;
  c10::ScalarType previous_dtype_ = c10::kBFloat16;
  bool previous_cache_enabled_ = true;
};

}  // namespace ddp
