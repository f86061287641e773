#include "spec/ngram.h"

#include <gtest/gtest.h>

namespace sieve::spec {
namespace {

using V = std::vector<int32_t>;

TEST(Ngram, ProposesWhatFollowedTheMostRecentEarlierMatchOfTheLongestSuffix) {
  NgramConfig c{3, 1, 4};
  // suffix "1 2 3" occurred at 0 (followed by 9 9) and at 5 (followed by 7 8 4): the latest wins.
  V t = {1, 2, 3, 9, 9, 1, 2, 3, 7, 8, 4, 1, 2, 3};
  EXPECT_EQ(propose_ngram(t, c, 3), (V{7, 8, 4}));
  EXPECT_EQ(propose_ngram(t, c, 2), (V{7, 8}));
  c.num_speculative_tokens = 1;
  EXPECT_EQ(propose_ngram(t, c, 3), (V{7}));
}

TEST(Ngram, PrefersLongerSuffixes) {
  NgramConfig c{2, 1, 3};
  // The 1-gram "5" last occurred at 6 (followed by 1); the 3-gram "3 4 5" at 0 (followed by 6 6).
  V t = {3, 4, 5, 6, 6, 0, 5, 1, 3, 4, 5};
  EXPECT_EQ(propose_ngram(t, c, 2), (V{6, 6}));
  c.prompt_lookup_max = 1;
  EXPECT_EQ(propose_ngram(t, c, 2), (V{1, 3}));
}

TEST(Ngram, NothingWhenNoSuffixRepeatsOrLimitsForbid) {
  NgramConfig c{3, 2, 4};
  EXPECT_TRUE(propose_ngram(V{1, 2, 3, 4, 5}, c, 3).empty());
  EXPECT_TRUE(propose_ngram(V{7}, c, 3).empty());
  EXPECT_TRUE(propose_ngram(V{}, c, 3).empty());
  EXPECT_TRUE(propose_ngram(V{1, 2, 1, 2}, c, 0).empty());
  // A 1-token repeat is below prompt_lookup_min = 2.
  EXPECT_TRUE(propose_ngram(V{4, 9, 1, 4}, c, 3).empty());
}

TEST(Ngram, ARunOfOneTokenProposesItAgain) {
  NgramConfig c{4, 1, 4};
  EXPECT_EQ(propose_ngram(V{8, 8, 8, 8, 8}, c, 4), (V{8}));
}

}  // namespace
}  // namespace sieve::spec
