#include "server/web_ui.h"

#include <charconv>

#include "server/static_files.h"

namespace sieve::server {

WebUi::WebUi(const engine::Engine& engine, const ServerOptions& opts)
    : engine_(engine), opts_(opts), history_([this] {
        return prometheus_text(engine_.stats(), opts_.served_model_names.front());
      }) {
  history_.start();
}

WebUi::~WebUi() {
  history_.stop();
}

nlohmann::json WebUi::info() const {
  const engine::EngineConfig& c = engine_.config();
  const RequestDefaults& d = opts_.defaults;
  nlohmann::json j = {
      {"version", "0.1.0"},
      {"model", opts_.served_model_names.front()},
      {"api_key_required", !opts_.api_key.empty()},
      {"reasoning_parser", opts_.reasoning_parser},
      {"tool_parser", opts_.tool_parser},
      {"max_model_len", c.scheduler.max_model_len},
      {"max_num_seqs", c.scheduler.max_num_seqs},
      {"max_num_batched_tokens", c.scheduler.max_num_batched_tokens},
      {"num_blocks", c.num_blocks},
      {"block_size", engine_.block_size()},
      {"prefix_caching", c.enable_prefix_caching},
      {"defaults",
       {{"temperature", d.temperature},
        {"top_p", d.top_p},
        {"top_k", d.top_k},
        {"min_p", d.min_p},
        {"repetition_penalty", d.repetition_penalty},
        {"max_tokens", d.max_tokens},
        {"max_logprobs", d.max_logprobs}}},
  };
  if (opts_.ui_info.is_object()) j.update(opts_.ui_info);
  return j;
}

std::optional<WebResponse> WebUi::get(std::string_view path, std::string_view since,
                                      std::string_view if_none_match) const {
  auto json_response = [](const nlohmann::json& j) {
    WebResponse r;
    r.content_type = "application/json";
    r.body = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    r.headers = {{"Cache-Control", "no-store"}};
    return r;
  };
  if (path == "/ui/info") return json_response(info());
  if (path == "/ui/metrics") {
    double after = 0;
    if (!since.empty()) {
      auto [p, ec] = std::from_chars(since.data(), since.data() + since.size(), after);
      if (ec != std::errc() || p != since.data() + since.size()) {
        WebResponse r =
            json_response({{"error",
                            {{"message", "since must be a number of seconds (unix time), got \"" +
                                             std::string(since) + "\""},
                             {"type", "BadRequestError"},
                             {"param", "since"},
                             {"code", 400}}}});
        r.status = 400;
        return r;
      }
    }
    return json_response(history_.json_since(after));
  }
  std::optional<StaticFile> f = find_static(path);
  if (!f) return std::nullopt;
  WebResponse r;
  r.headers = f->headers;
  r.headers.emplace_back("ETag", f->etag);
  if (etag_matches(if_none_match, *f)) {
    r.status = 304;
    return r;
  }
  r.content_type = std::string(f->content_type);
  r.body = std::string(f->body);
  return r;
}

}  // namespace sieve::server
