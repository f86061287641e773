#include "text/byte_level.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "core/error.h"
#include "text/chat_template.h"
#include "text/detokenizer.h"
#include "text/tokenizer.h"

namespace sieve::text {
namespace {

std::string temp_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("sieve_text_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  return d.string();
}

TEST(ByteLevelTokenizer, WritesALoadableTokenizerWithChatTokens) {
  std::string dir = temp_dir("bl");
  ByteLevelTokenizerInfo info = write_byte_level_tokenizer(dir, 300);
  EXPECT_EQ(info.bos_id, 256);
  EXPECT_EQ(info.eos_id, 258);
  EXPECT_EQ(info.used_ids, 256 + 10 + 8);
  Tokenizer tok = Tokenizer::load(dir);
  EXPECT_EQ(tok.vocab_size(), info.used_ids);
  EXPECT_EQ(tok.bos_id(), 256);
  EXPECT_EQ(tok.eos_ids(), std::vector<int32_t>{258});
  EXPECT_EQ(tok.token_to_id("]~b]"), 257);
  EXPECT_EQ(tok.token_to_id("]<]minimax[>["), 259);
  EXPECT_EQ(tok.token_to_id("<think>"), 260);
  EXPECT_EQ(tok.token_to_id("<mm:think>"), 264);
  EXPECT_EQ(tok.token_to_id("</mm:think>"), 265);
  EXPECT_TRUE(tok.is_special(257));
  EXPECT_FALSE(tok.is_special(260));
  // "the" merges to one token: Ġ t -> Ġt, h e -> he, Ġt he -> Ġthe.
  std::vector<int32_t> ids = tok.encode("a the", false);
  EXPECT_EQ(ids, (std::vector<int32_t>{'a', 270}));
  EXPECT_EQ(tok.decode(ids), "a the");
  std::string prompt =
      render_chat(tok, nlohmann::json::parse(R"([{"role":"user","content":"héllo 👋"}])"), nullptr,
                  true, nullptr);
  EXPECT_EQ(prompt, "]~!b[]~b]user\nhéllo 👋[e~[\n]~b]ai\n");
  std::vector<int32_t> pids = tok.encode(prompt, false);
  EXPECT_EQ(pids.front(), 256);
  EXPECT_EQ(pids[1], 257);
  EXPECT_EQ(tok.decode(pids, false), prompt);
  EXPECT_EQ(tok.decode(pids, true), "user\nhéllo 👋\nai\n");
  // The template writes ]~!b[ and encoding a rendered prompt adds no second one.
  EXPECT_EQ(std::count(pids.begin(), pids.end(), 256), 1);
  pids = tok.encode(render_chat(tok, nlohmann::json::parse(R"([{"role":"user","content":"x"}])"),
                                nullptr, true, {{"thinking_mode", "enabled"}}),
                    false);
  EXPECT_EQ(pids.back(), 264);  // <mm:think>, one token
  std::filesystem::remove_all(dir);
}

TEST(ByteLevelTokenizer, VocabularyTooSmallIsAnError) {
  EXPECT_THROW(write_byte_level_tokenizer(temp_dir("small"), 265), Error);
  std::string dir = temp_dir("exact");
  ByteLevelTokenizerInfo info = write_byte_level_tokenizer(dir, 266);
  EXPECT_EQ(info.used_ids, 266);  // no room for merges
  EXPECT_EQ(Tokenizer::load(dir).encode("the", false), (std::vector<int32_t>{'t', 'h', 'e'}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sieve::text
