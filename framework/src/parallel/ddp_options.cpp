#include "parallel/resolve_backend.h"

#include <stdexcept>

namespace ddp {

Backend parse_backend(const std::string& name) {
  if (name == "auto") return Backend::Auto;
  if (name == "mpi") return Backend::Mpi;
  if (name == "nccl") return Backend::Nccl;
  throw std::invalid_argument("unknown backend '" + name + "' (expected auto, mpi or nccl)");
}

const char* backend_name(Backend backend) {
  switch (backend) {
    case Backend::Auto:
      return "auto";
    case Backend::Mpi:
      return "mpi";
    case Backend::Nccl:
      return "nccl";
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
                                " and this rank's NCCL communicator works on " + rank_device.str() +
                                " (Runtime::device()): move the model to runtime.device()");
  }
  return Backend::Nccl;
}

}  // namespace ddp
