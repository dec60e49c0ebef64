#pragma once
// What the library reads of a Runtime beyond its public interface (internal): the MPI
// communicator the communicators are duplicated from, how the job was launched, and the thread
// choices. Kept out of <ddp/runtime.h> so that no user translation unit includes <mpi.h>.

#include <ddp/runtime.h>

#include "runtime/launcher.h"

#include <mpi.h>

#include <string>

namespace ddp {

struct Runtime::Impl {
  // The library's own duplicate of MPI_COMM_WORLD, for bootstrap exchanges: communicators are
  // duplicated from it, the NCCL unique id travels over it.
  MPI_Comm comm = MPI_COMM_NULL;
  LaunchInfo launch;     // from the environment the launcher left (read before MPI_Init)
  ThreadChoice threads;  // the rank's intra-op threads and why
};

namespace detail {

// How ddp ends the job on an error (Runtime::abort, MPI_COMM_WORLD's error handler): the line
// "ddp: rank R (host): message" in one write, then MPI_Abort(MPI_COMM_WORLD, exit_code).
[[noreturn]] void abort_job(int rank, const std::string& host, const std::string& message,
                            int exit_code);

struct RuntimeInternals {
  static MPI_Comm comm(const Runtime& runtime) { return runtime.impl_->comm; }
  static const LaunchInfo& launch(const Runtime& runtime) { return runtime.impl_->launch; }
};

}  // namespace detail
}  // namespace ddp
