// Data-parallel MNIST training over MPI ranks: mpirun -np 2 ddp_mnist --epochs 1
#include "mnist_example.h"

int main(int argc, char** argv) { return run_mnist_example(argc, argv, ddp::cli::Parallelism::DataParallel); }
