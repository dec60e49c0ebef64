#pragma once
// Everything a training program needs: #include <ddp/ddp.h>.

#include <ddp/adadelta.h>
#include <ddp/async_communicator.h>
#include <ddp/augment.h>
#include <ddp/batch_norm.h>
#include <ddp/checkpoint.h>
#include <ddp/cifar.h>
#include <ddp/communicator.h>
#include <ddp/config.h>
#include <ddp/dataset.h>
#include <ddp/ddp_options.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/distributed_sampler.h>
#include <ddp/lr_scheduler.h>
#include <ddp/mnist.h>
#include <ddp/mpi_communicator.h>
#include <ddp/progress.h>
#include <ddp/reducer.h>
#include <ddp/replica_check.h>
#include <ddp/runtime.h>
#include <ddp/snapshot.h>
#include <ddp/timeline.h>
#include <ddp/trainer.h>
#if DDP_WITH_NCCL
#include <ddp/nccl_bootstrap.h>
#endif
#if DDP_WITH_CUDA && DDP_WITH_NCCL
#include <ddp/nccl_communicator.h>
#endif
