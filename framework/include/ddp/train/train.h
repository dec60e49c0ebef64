#pragma once
/// \file
/// ddp's training kit (target ddp::train), on top of the core (<ddp/ddp.h>): parts that a
/// hand-written training loop composes in a few lines each, and the Trainer built from the same
/// parts.

#include <ddp/ddp.h>

#include <ddp/train/adadelta.h>
#include <ddp/train/augment.h>
#include <ddp/train/autocast.h>
#include <ddp/train/checkpointer.h>
#include <ddp/train/cifar.h>
#include <ddp/train/classification.h>
#include <ddp/train/data_source.h>
#include <ddp/train/divergence.h>
#include <ddp/train/grad_clip.h>
#include <ddp/train/grad_scaler.h>
#include <ddp/train/image_dataset.h>
#include <ddp/train/lr_schedule.h>
#include <ddp/train/lr_scheduler.h>
#include <ddp/train/metrics.h>
#include <ddp/train/mnist.h>
#include <ddp/train/progress.h>
#include <ddp/train/replica_check.h>
#include <ddp/train/reporter.h>
#include <ddp/train/snapshot.h>
#include <ddp/train/step_boundary.h>
#include <ddp/train/stop_agreement.h>
#include <ddp/train/task.h>
#include <ddp/train/trainer.h>
