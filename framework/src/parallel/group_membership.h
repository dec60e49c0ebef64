#pragma once
// Where a ProcessGroup's communicators come from (internal). A process that trains one replica
// takes them from the Runtime (process_membership, in process_group.cpp): MPI duplicates of its
// bootstrap communicator and one NCCL communicator. A replica thread takes them from its
// process's ReplicaSet (replicas.cpp): channels of the in-memory hub and the set's NCCL
// communicators. ProcessGroup knows only this interface: it does not depend on the replicas,
// which depend on it.

#include <ddp/communicator.h>
#include <ddp/process_group.h>

#include <memory>
#include <string>

namespace ddp::detail {

class GroupMembership {
 public:
  virtual ~GroupMembership() = default;
  // This member's index among the replicas of its process, and their count.
  virtual int replica() const = 0;
  virtual int replicas_per_process() const = 0;
  // A new communicator over every member of the job, for CPU tensors. Collective. `name` says
  // which it is in the debug mode's messages (ProcessGroup::new_cpu_communicator).
  virtual std::unique_ptr<Communicator> new_cpu_communicator(const std::string& name) = 0;
  // The NCCL communicator of this member's device; collective the first time. Called only
  // when the group's device is a CUDA device and the build has the NCCL communicator.
  virtual std::shared_ptr<Communicator> gpu_communicator() = 0;
  // How errors name this member beside its rank: "" for a process, or
  // " (replica 1 of 2 (replica 3 of the job's 4))".
  virtual std::string describe() const = 0;
};

}  // namespace ddp::detail
