#include "eval/gsm8k.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <optional>
#include <ostream>
#include <random>
#include <regex>
#include <thread>

#include "core/error.h"
#include "core/progress.h"

namespace sieve::eval {

std::vector<Gsm8kDoc> load_gsm8k(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error("cannot open GSM8K file " + path);
  std::vector<Gsm8kDoc> docs;
  std::string line;
  int n = 0;
  while (std::getline(f, line)) {
    ++n;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("question") || !j.contains("answer") ||
        !j["question"].is_string() || !j["answer"].is_string())
      throw Error(path + ":" + std::to_string(n) +
                  ": expected {\"question\": str, \"answer\": str}");
    docs.push_back({j["question"].get<std::string>(), j["answer"].get<std::string>()});
  }
  if (docs.empty()) throw Error("GSM8K file " + path + " has no rows");
  return docs;
}

namespace {
std::string strip(const std::string& s) {
  size_t b = s.find_first_not_of(" \t\n\r\f\v");
  if (b == std::string::npos) return "";
  size_t e = s.find_last_not_of(" \t\n\r\f\v");
  return s.substr(b, e - b + 1);
}
}  // namespace

std::string extract_strict(const std::string& response) {
  static const std::regex re("#### (-?[0-9.,]+)");
  std::smatch m;
  if (std::regex_search(response, m, re)) return strip(m[1].str());
  return kInvalid;
}

std::string extract_flexible(const std::string& response) {
  static const std::regex re("(-?[$0-9.,]{2,})|(-?[0-9]+)");
  std::string last;
  bool found = false;
  for (auto it = std::sregex_iterator(response.begin(), response.end(), re);
       it != std::sregex_iterator(); ++it) {
    const auto& m = *it;
    last = m[1].matched && m[1].length() > 0 ? m[1].str() : m[2].str();
    found = true;
  }
  if (!found || last.empty()) return kInvalid;
  return strip(last);
}

std::string normalize_answer(const std::string& s) {
  static const std::regex comma(","), dollar("\\$"), through_hashes("[\\s\\S]*#### "),
      final_dot("\\.$");
  std::string r = std::regex_replace(s, comma, "");
  r = std::regex_replace(r, dollar, "");
  r = std::regex_replace(r, through_hashes, "");
  r = std::regex_replace(r, final_dot, "");
  std::transform(r.begin(), r.end(), r.begin(),
                 [](unsigned char c) { return char(std::tolower(c)); });
  return r;
}

bool exact_match(const std::string& prediction, const std::string& reference) {
  return normalize_answer(prediction) == normalize_answer(reference);
}

const std::vector<std::string>& gsm8k_stop_strings() {
  static const std::vector<std::string> s{"Question:", "</s>", "<|im_end|>", "\n\n"};
  return s;
}

std::string cut_at_stop(const std::string& text) {
  size_t cut = text.size();
  for (const auto& s : gsm8k_stop_strings()) cut = std::min(cut, text.find(s));
  return text.substr(0, cut);
}

std::vector<size_t> fewshot_indices(size_t train_size, int k, uint64_t seed, size_t index) {
  if (k < 0) throw Error("--num-fewshot must be >= 0");
  if (size_t(k) > train_size) throw Error("--num-fewshot is larger than the train split");
  std::mt19937_64 rng(seed * 0x9e3779b97f4a7c15ull + index);
  std::vector<size_t> out;
  while (out.size() < size_t(k)) {
    size_t i = std::uniform_int_distribution<size_t>(0, train_size - 1)(rng);
    if (std::find(out.begin(), out.end(), i) == out.end()) out.push_back(i);
  }
  return out;
}

std::string completion_prompt(const std::vector<Gsm8kDoc>& shots, const Gsm8kDoc& doc) {
  std::string p;
  for (const auto& s : shots) p += "Question: " + s.question + "\nAnswer: " + s.answer + "\n\n";
  p += "Question: " + doc.question + "\nAnswer:";
  return p;
}

nlohmann::json chat_messages(const std::vector<Gsm8kDoc>& shots, const Gsm8kDoc& doc) {
  nlohmann::json m = nlohmann::json::array();
  for (const auto& s : shots) {
    m.push_back({{"role", "user"}, {"content", "Question: " + s.question + "\nAnswer:"}});
    m.push_back({{"role", "assistant"}, {"content", s.answer}});
  }
  m.push_back({{"role", "user"}, {"content", "Question: " + doc.question + "\nAnswer:"}});
  return m;
}

Score mean_score(const std::vector<int>& correct) {
  Score s;
  s.n = correct.size();
  if (s.n == 0) return s;
  double sum = 0;
  for (int c : correct) sum += c;
  s.value = sum / double(s.n);
  if (s.n < 2) {
    s.stderr_ = NAN;
    return s;
  }
  double ss = 0;
  for (int c : correct) ss += (c - s.value) * (c - s.value);
  s.stderr_ = std::sqrt(ss / double(s.n - 1)) / std::sqrt(double(s.n));
  return s;
}

namespace {

// pytablewriter's markdown as lm-eval prints it: headers centred, text left, numbers right.
std::string cell(const std::string& s, size_t width, char align) {
  size_t len = 0;
  for (unsigned char c : s) len += (c & 0xC0) != 0x80;  // count UTF-8 code points (↑, ±)
  size_t pad = width > len ? width - len : 0;
  if (align == 'l') return s + std::string(pad, ' ');
  if (align == 'r') return std::string(pad, ' ') + s;
  return std::string(pad / 2, ' ') + s + std::string(pad - pad / 2, ' ');
}

std::string fmt4(double v) {
  if (std::isnan(v)) return "N/A";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4f", v);
  return buf;
}

}  // namespace

std::string format_table(const Score& flexible, const Score& strict, int num_fewshot) {
  std::vector<std::string> head{"Tasks", "Version", "Filter", "n-shot", "Metric",
                                "",      "Value",   "",       "Stderr"};
  std::vector<char> align{'l', 'r', 'l', 'r', 'l', 'l', 'r', 'l', 'r'};
  std::vector<std::vector<std::string>> rows{
      {"gsm8k", "3", "flexible-extract", std::to_string(num_fewshot), "exact_match", "↑",
       fmt4(flexible.value), "±", fmt4(flexible.stderr_)},
      {"", "", "strict-match", std::to_string(num_fewshot), "exact_match", "↑", fmt4(strict.value),
       "±", fmt4(strict.stderr_)}};
  std::vector<size_t> w(head.size(), 3);
  auto width = [](const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  };
  for (size_t c = 0; c < head.size(); ++c) {
    w[c] = std::max(w[c], width(head[c]));
    for (const auto& r : rows) w[c] = std::max(w[c], width(r[c]));
  }
  std::string t = "|";
  for (size_t c = 0; c < head.size(); ++c) t += cell(head[c], w[c], 'c') + "|";
  t += "\n|";
  for (size_t c = 0; c < head.size(); ++c)
    t += (align[c] == 'r' ? std::string(w[c] - 1, '-') + ":" : std::string(w[c], '-')) + "|";
  t += "\n";
  for (const auto& r : rows) {
    t += "|";
    for (size_t c = 0; c < head.size(); ++c) t += cell(r[c], w[c], align[c]) + "|";
    t += "\n";
  }
  return t;
}

Gsm8kResult run_gsm8k(const Gsm8kOptions& o, std::atomic<bool>* stop, std::ostream& out) {
  if (o.num_concurrent < 1) throw Error("--num-concurrent must be at least 1");
  if (o.max_gen_toks < 1) throw Error("--max-gen-toks must be at least 1");
  auto train = load_gsm8k(o.data_dir + "/train.jsonl");
  auto test = load_gsm8k(o.data_dir + "/test.jsonl");
  if (o.limit) {
    if (*o.limit < 1) throw Error("--limit must be at least 1");
    if (size_t(*o.limit) < test.size()) test.resize(size_t(*o.limit));
  }
  std::string model = o.model.empty() ? bench::first_model(o.base_url, o.client) : o.model;
  out << (o.chat ? "local-chat-completions" : "local-completions") << " (model=" << model
      << ",base_url=" << o.base_url << (o.chat ? "/v1/chat/completions" : "/v1/completions")
      << ",num_concurrent=" << o.num_concurrent << "), gen_kwargs: (max_gen_toks=" << o.max_gen_toks
      << ",temperature=0), limit: " << (o.limit ? std::to_string(*o.limit) : std::string("None"))
      << ", num_fewshot: " << o.num_fewshot << std::endl;

  const size_t n = test.size();
  Gsm8kResult res;
  res.responses.assign(n, "");
  std::vector<int> failed(n, 0), answered(n, 0);
  std::atomic<size_t> next{0}, done{0}, correct{0};
  // On a terminal a bar, else a log line every few seconds; with the accuracy so far.
  std::optional<Progress> bar;
  if (o.progress) bar.emplace(ProgressOptions{.label = "gsm8k", .total = n, .unit = "q"});
  std::atomic<bool> never{false};
  std::atomic<bool>* cancel = stop ? stop : &never;
  const std::string path = o.chat ? "/v1/chat/completions" : "/v1/completions";
  std::mutex err_mu;
  std::string first_error;

  auto worker = [&] {
    bench::HttpSession s(o.base_url, o.client);
    for (;;) {
      size_t i = next++;
      if (i >= n || cancel->load()) return;
      std::vector<Gsm8kDoc> shots;
      for (size_t k : fewshot_indices(train.size(), o.num_fewshot, o.seed, i))
        shots.push_back(train[k]);
      nlohmann::json body{{"model", model},
                          {"temperature", 0},
                          {"stop", gsm8k_stop_strings()},
                          {"stream", true},
                          {"stream_options", {{"include_usage", true}}}};
      if (o.chat) {
        body["messages"] = chat_messages(shots, test[i]);
        body["max_completion_tokens"] = o.max_gen_toks;
      } else {
        body["prompt"] = completion_prompt(shots, test[i]);
        body["max_tokens"] = o.max_gen_toks;
      }
      std::string payload = body.dump();
      bench::RequestRecord rec;
      for (int attempt = 0; attempt <= o.retries && !cancel->load(); ++attempt) {
        rec = bench::RequestRecord{};
        bench::StreamState st;
        st.chat = o.chat;
        s.stream_post(path, payload, st, rec, cancel);
        if (rec.success()) break;
      }
      if (rec.success()) {
        res.responses[i] = cut_at_stop(rec.generated_text);
        if (exact_match(extract_flexible(res.responses[i]), test[i].answer)) ++correct;
      } else {
        failed[i] = 1;
        std::lock_guard<std::mutex> lk(err_mu);
        if (first_error.empty()) first_error = rec.error;
      }
      if (!cancel->load()) answered[i] = 1;
      const size_t d = ++done;
      if (bar) {
        char note[48];
        std::snprintf(note, sizeof note, "flexible-extract %.3f", double(correct.load()) / double(d));
        bar->set_note(note);
        bar->add(1);
      }
    }
  };
  std::vector<std::thread> pool;
  for (int w = 0; w < std::min<int>(o.num_concurrent, int(n)); ++w) pool.emplace_back(worker);
  for (auto& t : pool) t.join();
  bar.reset();

  if (cancel->load()) out << "Interrupted: scoring the questions answered so far" << std::endl;
  std::vector<int> flex, strict;
  std::ofstream samples;
  if (!o.output_path.empty()) {
    samples.open(o.output_path);
    if (!samples) throw Error("cannot write --output-path " + o.output_path);
  }
  for (size_t i = 0; i < n; ++i) {
    if (!answered[i]) continue;  // cut short by an interrupt
    std::string f = extract_flexible(res.responses[i]), s = extract_strict(res.responses[i]);
    flex.push_back(exact_match(f, test[i].answer));
    strict.push_back(exact_match(s, test[i].answer));
    res.failed_requests += failed[i];
    if (samples)
      samples << nlohmann::json{{"doc_id", i},
                                {"question", test[i].question},
                                {"target", test[i].answer},
                                {"response", res.responses[i]},
                                {"flexible-extract", f},
                                {"strict-match", s},
                                {"flexible_correct", flex.back()},
                                {"strict_correct", strict.back()},
                                {"failed", bool(failed[i])}}
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  }
  if (res.failed_requests > 0)
    out << "warning: " << res.failed_requests << " requests failed after " << o.retries
        << " retries and count as wrong; first error: " << first_error << std::endl;
  res.flexible = mean_score(flex);
  res.strict = mean_score(strict);
  res.table = format_table(res.flexible, res.strict, o.num_fewshot);
  out << res.table << std::flush;
  return res;
}

}  // namespace sieve::eval
