// Single-process MNIST training (the seeds' mnist_classify.py, in C++).
#include "mnist_example.h"

int main(int argc, char** argv) { return run_mnist_example(argc, argv, ddp::cli::Parallelism::SingleProcess); }
