#include "comm/nccl/nccl_bootstrap.h"
#include "runtime/runtime_internals.h"

#include "test_support.h"

#include <gtest/gtest.h>

#include <cstring>

namespace test_nccl_bootstrap {

TEST(NcclBootstrap, EveryRankHoldsRankZerosUniqueId) {
  const ncclUniqueId id = ddp::broadcast_nccl_unique_id(
      ddp::detail::RuntimeInternals::comm(ddp_test::runtime()), ddp_test::runtime().rank());
  torch::Tensor mine = torch::empty({static_cast<int64_t>(sizeof id)}, torch::kByte);
  std::memcpy(mine.data_ptr(), &id, sizeof id);
  const torch::Tensor all = ddp_test::group().cpu().all_gather(mine);
  for (int r = 0; r < ddp_test::runtime().world_size(); ++r) {
    EXPECT_TRUE(torch::equal(all[r], all[0])) << "rank " << r << " holds other bytes";
  }
  EXPECT_GT(mine.count_nonzero().item<int64_t>(), 0) << "the id is all zeros: never created";
}

}  // namespace test_nccl_bootstrap
