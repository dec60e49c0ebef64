// Single-process CIFAR-10 training (the seeds' one-GPU CIFAR runs, in C++).
#include "cifar_example.h"

int main(int argc, char** argv) { return run_cifar_example(argc, argv, ddp::cli::Parallelism::SingleProcess); }
