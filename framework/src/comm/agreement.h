#pragma once
// Cross-rank agreement: "do all ranks hold the same value?", the one helper the library uses
// wherever ranks must agree before they issue collectives (the backend, the bucket layout, the
// model's structure, a snapshot's contents).

#include <ddp/communicator.h>

#include <optional>
#include <string>

namespace ddp {

// The first rank whose value differs from rank 0's, and both values; empty when all agree.
// Collective (every rank gets the same answer).
struct Disagreement {
  int rank;
  std::string value;  // that rank's value
  std::string rank0_value;
};
std::optional<Disagreement> find_disagreement(Communicator& comm, const std::string& mine);

// Throws std::runtime_error on every rank when the ranks disagree:
//   "<what> differs across ranks: rank 0 has <v0>; rank R has <vR>. <hint>"
// Collective.
void require_agreement(Communicator& comm, const std::string& what, const std::string& mine,
                       const std::string& hint = "");

}  // namespace ddp
