#include "text/unicode.h"

#include <gtest/gtest.h>

namespace sieve::text {
namespace {

TEST(Unicode, Nfc) {
  EXPECT_EQ(nfc("cafe\u0301"), "caf\u00e9");
  EXPECT_EQ(nfc("plain ascii"), "plain ascii");
  EXPECT_EQ(nfc("\u2126"), "\u03a9");              // singleton decomposition
  EXPECT_EQ(nfc("\u1100\u1161\u11a8"), "\uac01");  // Hangul LVT
  EXPECT_EQ(nfc("a\u0323\u0302"), "\u1ead");       // reordering then composition
  EXPECT_EQ(nfc("a\u0302\u0323"), "\u1ead");
  EXPECT_EQ(nfc("\u0f73"), "\u0f71\u0f72");         // composition exclusion
  EXPECT_EQ(nfc("\ufb01"), "\ufb01");               // compatibility only: NFC keeps it
  EXPECT_EQ(nfc("e\u0301\u0301"), "\u00e9\u0301");  // second acute is blocked
}

TEST(Unicode, Lossy) {
  EXPECT_EQ(utf8_lossy("ok"), "ok");
  EXPECT_EQ(utf8_lossy("a\xffz"), "a\uFFFDz");
  EXPECT_EQ(utf8_lossy("\xe2\x82"), "\uFFFD");                  // truncated: one replacement
  EXPECT_EQ(utf8_lossy("\xe0\x80\x80"), "\uFFFD\uFFFD\uFFFD");  // overlong: byte by byte
  EXPECT_EQ(utf8_lossy("\xf0\x9f\x98\x80"), "\U0001F600");
}

TEST(Unicode, FindInvalid) {
  EXPECT_EQ(find_invalid_utf8("hello world, long ascii run"), std::string_view::npos);
  EXPECT_EQ(find_invalid_utf8("0123456789\x80"), 10u);
  EXPECT_EQ(find_invalid_utf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(utf8_sequence_length("\xf0\x9f", 0), -1);
}

}  // namespace
}  // namespace sieve::text
