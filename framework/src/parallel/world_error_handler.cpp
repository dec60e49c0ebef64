// MPI_COMM_WORLD's error handler (world_error_handler.h).
#include "parallel/world_error_handler.h"

#include "comm/mpi/mpi_worker.h"
#include "runtime/runtime_internals.h"
#include "util/mpi_check.h"

#include <mpi.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>

namespace ddp::detail {

namespace {

// Never returns: Open MPI has half cleaned up the failed schedule, and a program that goes on
// crashes. The first thread in names the call and ends the job; others wait for its MPI_Abort; an
// error while naming (a second entry on that thread) ends the job at once with MPI's error.
void world_error_handler(MPI_Comm* comm, int* code, ...) {
  static std::atomic<bool> handling{false};
  thread_local bool naming = false;
  int rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[MPI_MAX_PROCESSOR_NAME] = "?";
  int length = 1;
  MPI_Get_processor_name(host, &length);
  const std::string error = mpi_error_text(*code);
  if (naming) abort_job(rank, std::string(host, length), error, 1);
  if (handling.exchange(true)) {
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
  }
  naming = true;
  std::string message = MpiWorker::failing_call_message(error);
  if (message.empty()) {
    char name[MPI_MAX_OBJECT_NAME] = "";
    int name_length = 0;
    MPI_Comm_get_name(*comm, name, &name_length);
    message = "an MPI call on " +
              (name_length ? std::string(name, name_length) : "a communicator") +
              " failed: " + error;
  }
  abort_job(rank, std::string(host, length), message, 1);
}

}  // namespace

void install_world_error_handler() {
  struct Handle {  // an error handler reference, freed at the end
    MPI_Errhandler handle = MPI_ERRHANDLER_NULL;
    ~Handle() {
      if (handle != MPI_ERRHANDLER_NULL) MPI_Errhandler_free(&handle);
    }
  } current, ours;
  DDP_MPI_CHECK(MPI_Comm_get_errhandler(MPI_COMM_WORLD, &current.handle));
  if (current.handle != MPI_ERRORS_ARE_FATAL) return;
  DDP_MPI_CHECK(MPI_Comm_create_errhandler(world_error_handler, &ours.handle));
  DDP_MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, ours.handle));  // MPI keeps its own
}

}  // namespace ddp::detail
