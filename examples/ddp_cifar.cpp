// Data-parallel CIFAR-10 training: mpirun -np 2 ddp_cifar, srun -N 2 --ntasks-per-node 2 ddp_cifar
#include "cifar_example.h"

int main(int argc, char** argv) { return run_cifar_example(argc, argv, ddp::cli::Parallelism::DataParallel); }
