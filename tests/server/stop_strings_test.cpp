#include "server/stop_strings.h"

#include <gtest/gtest.h>

namespace sieve::server {

TEST(StopStrings, MatchesAcrossPiecesAndExcludesTheStop) {
  StopStringMatcher m({"STOP", "\n\n"});
  std::string out;
  out += m.push("Hello S");
  EXPECT_EQ(out, "Hello ");  // "S" might start STOP
  out += m.push("T");
  EXPECT_EQ(out, "Hello ");
  out += m.push("Oat");  // "STOa": not a stop after all
  EXPECT_EQ(out, "Hello STOat");
  out += m.push(" wor");
  out += m.push("ldST");
  out += m.push("OP and more");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "STOP");
  EXPECT_EQ(out, "Hello STOat world");
  EXPECT_EQ(m.push("x"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, EarliestMatchWinsAndFlushReleasesHeldText) {
  StopStringMatcher m({"bc", "abcd"});
  EXPECT_EQ(m.push("xab"), "x");  // "ab" could start abcd
  EXPECT_EQ(m.push("cd"), "");    // "abcd" starts before "bc"
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "abcd");
  StopStringMatcher k({"bc", "abcd"});
  EXPECT_EQ(k.push("xab"), "x");
  EXPECT_EQ(k.push("ce"), "a");
  EXPECT_EQ(k.matched(), "bc");
  StopStringMatcher n({"END"});
  EXPECT_EQ(n.push("the EN"), "the ");
  EXPECT_EQ(n.flush(), "EN");
  StopStringMatcher early({"ab"});
  EXPECT_EQ(early.push("xa"), "x");
  EXPECT_EQ(early.push_unchecked("b"), "ab");  // min_tokens not reached: no stop
  EXPECT_FALSE(early.stopped());
  EXPECT_EQ(early.push("zab"), "z");
  EXPECT_TRUE(early.stopped());
  StopStringMatcher none({});
  EXPECT_EQ(none.push("abc"), "abc");
}

}  // namespace sieve::server
