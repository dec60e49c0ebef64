/* One 16 MiB message between 2 ranks, three times each way: MPI_Send one way, then
 * MPI_Sendrecv both ways at once. On a full-duplex link both take the same time; used by
 * bench/emulated_duplex.sh to show how Open MPI's TCP transport shares a link between directions.
 * Build: mpicc -O2 bench/mpi_exchange.c -o mpi_exchange */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
int main(int c, char** v) {
  MPI_Init(&c, &v);
  int r;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  size_t n = 16u << 20;
  char* a = malloc(n);
  char* b = malloc(n);
  for (int mode = 0; mode < 2; ++mode)
    for (int it = 0; it < 3; ++it) {
      MPI_Barrier(MPI_COMM_WORLD);
      double t = MPI_Wtime();
      if (mode == 0) {
        if (r == 0)
          MPI_Send(a, n, MPI_CHAR, 1, 0, MPI_COMM_WORLD);
        else
          MPI_Recv(b, n, MPI_CHAR, 0, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else
        MPI_Sendrecv(a, n, MPI_CHAR, 1 - r, 0, b, n, MPI_CHAR, 1 - r, 0, MPI_COMM_WORLD,
                     MPI_STATUS_IGNORE);
      MPI_Barrier(MPI_COMM_WORLD);
      t = MPI_Wtime() - t;
      if (r == 0)
        printf("%s 16 MiB: %.0f ms %.1f MB/s per direction\n", mode ? "sendrecv" : "send   ",
               t * 1e3, n / t / 1e6);
    }
  MPI_Finalize();
}
