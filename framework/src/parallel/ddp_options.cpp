#include "parallel/resolve_backend.h"

#include <stdexcept>

namespace ddp {

Compression parse_compression(const std::string& name) {
  if (name == "none") return Compression::None;
  if (name == "fp16") return Compression::Fp16;
  if (name == "bf16") return Compression::Bf16;
  throw std::invalid_argument("unknown compression '" + name + "' (expected none, fp16 or bf16)");
}

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  throw std::invalid_argument("unknown backend '" + name + "' (expected auto, mpi or nccl)");
}

const char* compression_name(Compression compression) {
  switch (compression) {
    case Compression::None: return "none";
    case Compression::Fp16: return "fp16";
    case Compression::Bf16: return "bf16";
  }
  return "?";
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto: return "auto";
    case Backend::Mpi: return "mpi";
    case Backend::Nccl: return "nccl";
  }
  return "?";
}

Backend resolve_backend(Backend requested, c10::Device params_device, c10::Device rank_device,
                        bool nccl_built) {
  if (requested == Backend::Mpi) return Backend::Mpi;
  if (requested == Backend::Auto) {
    const bool nccl = nccl_built && params_device.is_cuda() && params_device == rank_device;
    return nccl ? Backend::Nccl : Backend::Mpi;
  }
  const std::string option = "DDPOptions::backend is nccl, but ";
  if (!params_device.is_cuda()) {
    throw std::invalid_argument(option + "the parameters are on " + params_device.str() +
                                ": NCCL reduces CUDA tensors only (move the model to "
                                "runtime.device(), or use Backend::Mpi or Backend::Auto)");
  }
  if (!nccl_built) {
    throw std::invalid_argument(option +
                                "this build of ddp has no NCCL communicator (configure it with a "
                                "CUDA LibTorch and NCCL >= 2.10, see docs/gpu.md; or use "
                                "Backend::Mpi or Backend::Auto)");
  }
  if (params_device != rank_device) {
    throw std::invalid_argument(option + "the parameters are on " + params_device.str() +
                                " and this rank's NCCL communicator works on " +
                                rank_device.str() +
                                " (Runtime::device()): move the model to runtime.device()");
  }
  return Backend::Nccl;
}

}  // namespace ddp
