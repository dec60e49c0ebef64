#pragma once
// MPI_COMM_WORLD's error handler, in place of MPI_ERRORS_ARE_FATAL. Open MPI reports a failed
// non-blocking collective's request (MPI_ERR_TRUNCATE in MPI_Test: the ranks called different
// collectives) through MPI_COMM_WORLD's handler, not the worker's duplicate's, so the default
// ended the job with Open MPI's lines alone. This one names the collective as a worker names a
// failed call and ends the job with status 1. Installed by the first ProcessGroup.

namespace ddp::detail {

// Installs the handler when MPI_COMM_WORLD has MPI's default; a handler the program set itself
// stays, and a second call finds ours. After MPI_Init.
void install_world_error_handler();

}  // namespace ddp::detail
