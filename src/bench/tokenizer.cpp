// Adapter from sieve_text's tokenizer to TextCodec. The bench library builds without sieve_text
// (SIEVE_BENCH_HAVE_TEXT unset); then --tokenizer is refused with a message saying why.
#include <cstdint>
#include <string>
#include <vector>

#include "bench/dataset.h"
#include "core/error.h"

#if defined(SIEVE_BENCH_HAVE_TEXT) && __has_include("text/tokenizer.h")
#include "text/tokenizer.h"
#define SIEVE_BENCH_TEXT 1
#endif

namespace sieve::bench {

#ifdef SIEVE_BENCH_TEXT
namespace {

// Prompts are counted without special tokens, as vLLM's random dataset counts them.
class SieveTextCodec final : public TextCodec {
 public:
  explicit SieveTextCodec(sieve::text::Tokenizer t) : t_(std::move(t)) {}
  std::vector<int> encode(const std::string& text) const override {
    auto ids = t_.encode(text, /*add_special_tokens=*/false);
    return std::vector<int>(ids.begin(), ids.end());
  }
  std::string decode(const std::vector<int>& ids) const override {
    return t_.decode(std::vector<int32_t>(ids.begin(), ids.end()));
  }
  int vocab_size() const override { return int(t_.vocab_size()); }

 private:
  sieve::text::Tokenizer t_;
};

}  // namespace

bool tokenizer_available() {
  return true;
}

std::unique_ptr<TextCodec> load_tokenizer(const std::string& dir) {
  return std::make_unique<SieveTextCodec>(sieve::text::Tokenizer::load(dir));
}
#else
bool tokenizer_available() {
  return false;
}

std::unique_ptr<TextCodec> load_tokenizer(const std::string& dir) {
  throw Error("--tokenizer " + dir +
              ": this build has no tokenizer library (sieve_text); use token-id prompts "
              "(random dataset without --tokenizer) or rebuild with src/text present");
}
#endif

}  // namespace sieve::bench
