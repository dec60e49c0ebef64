#include "comm/agreement.h"

#include <stdexcept>

namespace ddp {

std::optional<Disagreement> find_disagreement(Communicator& comm, const std::string& mine) {
  const std::vector<std::string> all = all_gather_strings(comm, mine);
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] != all[0]) return Disagreement{static_cast<int>(r), all[r], all[0]};
  }
  return std::nullopt;
}

void require_agreement(Communicator& comm, const std::string& what, const std::string& mine,
                       const std::string& hint) {
  const auto differs = find_disagreement(comm, mine);
  if (!differs) return;
  throw std::runtime_error(what + " differs across ranks: rank 0 has " + differs->rank0_value +
                           "; rank " + std::to_string(differs->rank) + " has " + differs->value +
                           (hint.empty() ? "" : ". " + hint));
}

}  // namespace ddp
