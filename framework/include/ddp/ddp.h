#pragma once
/// \file
/// ddp, the core: everything a C++ training program needs to train data-parallel over MPI ranks.
///
///   ddp::Runtime runtime(argc, argv);                    // MPI up; rank, node, device
///   return ddp::run_or_abort(runtime, [&] {              // an error on any rank ends the job
///     ddp::ProcessGroup group(runtime);                  // the job's communicators
///     ddp::DistributedDataParallel model(group, net);    // rank 0's weights everywhere
///     ddp::DistributedSampler sampler(size, group.size(), group.rank());
///     ...                                                // forward, loss.backward(): averaged
///   });
///
/// The training kit is <ddp/train/train.h>. No header here includes MPI, NCCL or CUDA's runtime.

#include <ddp/config.h>

#include <ddp/checkpoint_file.h>
#include <ddp/comm_hook.h>
#include <ddp/communicator.h>
#include <ddp/distributed_data_parallel.h>
#include <ddp/distributed_sampler.h>
#include <ddp/process_group.h>
#include <ddp/runtime.h>
#include <ddp/stop_signal.h>
#include <ddp/sync_batch_norm.h>
#include <ddp/timeline.h>
#include <ddp/zero_redundancy_optimizer.h>
