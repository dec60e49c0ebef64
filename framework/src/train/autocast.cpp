#include <ddp/train/autocast.h>

#include <ATen/autocast_mode.h>
#include <c10/core/Device.h>

#include <stdexcept>

namespace ddp {

std::string amp_mode_name(AmpMode mode) {
  switch (mode) {
    case AmpMode::Off:
      return "off";
    case AmpMode::Bf16:
      return "bf16";
    case AmpMode::Fp16:
      return "fp16";
  }
  return "?";
}

AmpMode parse_amp_mode(const std::string& text) {
  if (text == "off") return AmpMode::Off;
  if (text == "bf16") return AmpMode::Bf16;
  if (text == "fp16") return AmpMode::Fp16;
  throw std::invalid_argument("mixed precision '" + text + "': expected off, bf16 or fp16");
}

Autocast::Autocast(c10::DeviceType device_type, c10::ScalarType dtype, bool enabled)
    : device_type_(device_type) {
  if (dtype != c10::kBFloat16 && dtype != c10::kHalf) {
    throw std::invalid_argument(std::string("Autocast: dtype must be bfloat16 or float16 (got ") +
                                c10::toString(dtype) + ")");
  }
  if (!at::autocast::is_autocast_available(device_type)) {
    throw std::invalid_argument("Autocast: LibTorch has no autocast for device type " +
                                c10::DeviceTypeName(device_type, /*lower_case=*/true));
  }
  // As torch.autocast.__enter__.
  previous_cache_enabled_ = at::autocast::is_autocast_cache_enabled();
  was_enabled_ = at::autocast::is_autocast_enabled(device_type);
  previous_dtype_ = at::autocast::get_autocast_dtype(device_type);
  at::autocast::set_autocast_enabled(device_type, enabled);
  at::autocast::set_autocast_dtype(device_type, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  // As torch.autocast.__exit__: the cast cache lives as long as the outermost guard.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(device_type_, was_enabled_);
  at::autocast::set_autocast_dtype(device_type_, previous_dtype_);
  at::autocast::set_autocast_cache_enabled(previous_cache_enabled_);
}

}  // namespace ddp
