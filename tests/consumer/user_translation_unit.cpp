// A user's translation unit that includes the whole core: it must see no MPI and no NCCL, so a
// program built against ddp needs neither's headers, and a header of ours that pulls one in
// again fails this project's build (issue 24).
#include <ddp/ddp.h>

#ifdef MPI_VERSION
#error "<ddp/ddp.h> brought <mpi.h> into a user's translation unit"
#endif
#ifdef OMPI_MAJOR_VERSION
#error "<ddp/ddp.h> brought Open MPI's headers into a user's translation unit"
#endif
#ifdef NCCL_MAJOR
#error "<ddp/ddp.h> brought <nccl.h> into a user's translation unit"
#endif
#ifdef CUDART_VERSION
#error "<ddp/ddp.h> brought the CUDA runtime's headers into a user's translation unit"
#endif

// Something of every core header, so that each is compiled, not only included.
int user_translation_unit_uses_the_core() {
  ddp::DDPOptions options;
  ddp::DistributedSampler sampler(10, 2, 0);
  return static_cast<int>(sampler.num_samples()) + static_cast<int>(options.bucket_cap_mb) +
         ddp::kStoppedExitCode + DDP_VERSION_MAJOR * 0 + static_cast<int>(ddp::version()[0] != 0);
}
