#include <gtest/gtest.h>

#include <vector>

#include "kv/fp_cache.h"

namespace qs {
namespace {

TEST(FpKvCache, WritesReadsAndRollsBack) {
  FpKvCache c(3, 10, 4);
  EXPECT_EQ(c.length(), 0);
  EXPECT_EQ(c.bytes(), 2u * 3 * 10 * 4 * sizeof(float));
  std::vector<float> k(3 * 4), v(3 * 4);
  for (int i = 0; i < 12; ++i) {
    k[i] = float(i);
    v[i] = float(100 + i);
  }
  ASSERT_TRUE(c.check_write(0, 3).ok());
  for (int l = 0; l < 3; ++l) c.write(l, 0, 3, k.data(), v.data());
  c.set_length(3);
  EXPECT_EQ(c.length(), 3);
  EXPECT_EQ(c.k(2)[2 * 4 + 1], 9.0f);  // position 2, channel 1
  EXPECT_EQ(c.v(1)[0], 100.0f);

  // Overwrite from position 1 (speculative verification) and roll back.
  std::vector<float> k2(4, -1.0f), v2(4, -2.0f);
  ASSERT_TRUE(c.check_write(1, 1).ok());
  c.write(0, 1, 1, k2.data(), v2.data());
  EXPECT_EQ(c.k(0)[4], -1.0f);
  EXPECT_EQ(c.k(0)[0], 0.0f);
  EXPECT_EQ(c.k(1)[4], 4.0f);  // other layers untouched
  c.truncate(1);
  EXPECT_EQ(c.length(), 1);
  c.clear();
  EXPECT_EQ(c.length(), 0);
}

TEST(FpKvCache, CapacityIsAUserError) {
  FpKvCache c(1, 8, 2);
  EXPECT_TRUE(c.check_write(0, 8).ok());
  Status st = c.check_write(0, 9);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.error().message, "context is full: 9 positions needed but the KV cache holds 8");
  c.set_length(6);
  EXPECT_TRUE(c.check_write(6, 2).ok());
  EXPECT_FALSE(c.check_write(6, 3).ok());
  EXPECT_TRUE(c.check_write(2, 6).ok());  // overwrite inside
}

TEST(FpKvCacheDeathTest, GapsAndBadTruncationAreBugs) {
  FpKvCache c(1, 8, 2);
  c.set_length(2);
  EXPECT_DEATH((void)c.check_write(3, 1), "gap");
  EXPECT_DEATH(c.truncate(3), "");
}

}  // namespace
}  // namespace qs
