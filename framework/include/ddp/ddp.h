#pragma once
// Everything a training program needs: #include <ddp/ddp.h>. The folders are the layers, each
// including only those below it (docs/architecture.md):
//   runtime/  where the job runs          comm/  collectives (Communicator, Work)
//   parallel/ ProcessGroup, DistributedDataParallel
//   data/ optim/ nn/  data sets and sampler, optimizers and schedules, layers
//   train/    the Trainer and what it writes
// The backends (comm/mpi_communicator.h, comm/nccl_communicator.h) are not included: a program
// gets its communicators from ProcessGroup.

#include <ddp/config.h>

#include <ddp/runtime/runtime.h>

#include <ddp/comm/agreement.h>
#include <ddp/comm/communicator.h>

#include <ddp/parallel/ddp_options.h>
#include <ddp/parallel/distributed_data_parallel.h>
#include <ddp/parallel/process_group.h>
#include <ddp/parallel/replica_check.h>
#include <ddp/parallel/replicas.h>

#include <ddp/data/augment.h>
#include <ddp/data/cifar.h>
#include <ddp/data/data_loader_sampler.h>
#include <ddp/data/dataset.h>
#include <ddp/data/distributed_sampler.h>
#include <ddp/data/mnist.h>
#include <ddp/nn/autocast.h>
#include <ddp/nn/batch_norm.h>
#include <ddp/nn/dropout.h>
#include <ddp/optim/adadelta.h>
#include <ddp/optim/grad_clip.h>
#include <ddp/optim/grad_scaler.h>
#include <ddp/optim/lr_schedule.h>
#include <ddp/optim/lr_scheduler.h>

#include <ddp/train/memory_check.h>
#include <ddp/train/progress.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/task.h>
#include <ddp/train/classification.h>
#include <ddp/parallel/timeline.h>
#include <ddp/train/trainer.h>

#include <ddp/util/checkpoint.h>
#include <ddp/util/generator.h>
#include <ddp/util/stop_signal.h>
