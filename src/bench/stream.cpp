#include "bench/stream.h"

#include <nlohmann/json.hpp>

namespace sieve::bench {

void SseSplitter::feed(std::string_view bytes,
                       const std::function<void(std::string_view payload)>& on_data) {
  pending_.append(bytes.data(), bytes.size());
  size_t begin = 0;
  for (;;) {
    size_t nl = pending_.find('\n', begin);
    if (nl == std::string::npos) break;
    std::string_view line(pending_.data() + begin, nl - begin);
    begin = nl + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.substr(0, 5) != "data:") continue;
    line.remove_prefix(5);
    if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
    if (!line.empty()) on_data(line);
  }
  pending_.erase(0, begin);
}

void apply_sse_payload(std::string_view payload, double t, StreamState& st, RequestRecord& rec) {
  if (payload == "[DONE]") {
    st.done = true;
    return;
  }
  auto j = nlohmann::json::parse(payload, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    if (rec.error.empty())
      rec.error = "invalid JSON in SSE chunk: " + std::string(payload.substr(0, 200));
    return;
  }
  if (j.contains("error") && !j["error"].is_null()) {
    if (rec.error.empty()) {
      const auto& e = j["error"];
      rec.error = e.is_object() && e.contains("message") && e["message"].is_string()
                      ? "server error in stream: " + e["message"].get<std::string>()
                      : "server error in stream: " + e.dump();
    }
    return;
  }
  auto choices = j.find("choices");
  if (choices != j.end() && choices->is_array() && !choices->empty()) {
    rec.chunk_times.push_back(t);
    const auto& c = (*choices)[0];
    const nlohmann::json* text = nullptr;
    if (st.chat) {
      auto d = c.find("delta");
      if (d != c.end() && d->is_object()) {
        auto ct = d->find("content");
        if (ct != d->end()) text = &*ct;
      }
    } else {
      auto tx = c.find("text");
      if (tx != c.end()) text = &*tx;
    }
    if (text && text->is_string()) rec.generated_text += text->get<std::string>();
  }
  auto usage = j.find("usage");
  if (usage != j.end() && usage->is_object()) {
    auto ct = usage->find("completion_tokens");
    if (ct != usage->end() && ct->is_number_integer()) rec.output_tokens = ct->get<int>();
    auto pt = usage->find("prompt_tokens");
    if (pt != usage->end() && pt->is_number_integer()) st.usage_prompt_tokens = pt->get<int>();
  }
}

}  // namespace sieve::bench
