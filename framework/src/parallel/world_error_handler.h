#pragma once
// MPI_COMM_WORLD's error handler, in place of MPI's default (MPI_ERRORS_ARE_FATAL). Open MPI 4.1
// reports the error of a non-blocking collective's request (MPI_ERR_TRUNCATE in MPI_Test: the
// ranks called different collectives) through MPI_COMM_WORLD's handler, not through that of the
// communicator it ran on (a worker's duplicate returns its errors: comm/mpi/mpi_worker.h), so the
// default ended the job with Open MPI's lines alone. The handler names the failed collective as a
// worker names a failed call (the other ranks' calls, the likely cause) and ends the job with
// status 1 (Runtime::abort's line). Installed by the first ProcessGroup: the collectives it can
// name are its communicators'.

namespace ddp::detail {

// Installs the handler when MPI_COMM_WORLD has MPI's default; a handler the program set itself
// stays, and a second call finds ours. After MPI_Init.
void install_world_error_handler();

}  // namespace ddp::detail
