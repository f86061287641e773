// A live server for tests: the HTTP server in-process on a loopback port over the paged fake
// model and a byte-level tokenizer, its engine running; stopped and cleaned up on destruction.
#pragma once

#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include "../engine/fake_model.h"
#include "server/server.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace sieve::server {

struct Rig {
  std::string dir;
  text::Tokenizer tok;
  engine::testing::FakeModel model{300, 16};
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<Server> srv;
  std::thread runner;

  static std::string make_dir() {
    static int n = 0;
    auto d = std::filesystem::temp_directory_path() /
             ("sieve-server-test-" + std::to_string(::getpid()) + "-" + std::to_string(++n));
    text::write_byte_level_tokenizer(d.string(), 300);
    return d.string();
  }
  explicit Rig(ServerOptions o = {}, int64_t max_len = 256, int64_t blocks = 32,
               bool prefix_caching = false, int max_seqs = 8)
      : dir(make_dir()), tok(text::Tokenizer::load(dir)) {
    model.allocate_caches({.num_blocks = blocks});
    engine::EngineConfig ec;
    ec.scheduler.max_num_batched_tokens = 64;
    ec.scheduler.max_num_seqs = max_seqs;
    ec.scheduler.max_model_len = max_len;
    ec.num_blocks = blocks;
    ec.enable_prefix_caching = prefix_caching;
    engine = std::make_unique<engine::Engine>(model, ec);
    o.port = 0;
    srv = std::make_unique<Server>(*engine, tok, o);
    srv->bind();
    engine->start();
    runner = std::thread([this] { srv->run(); });
  }
  ~Rig() {
    srv->shutdown();
    runner.join();
    engine->stop();
    std::filesystem::remove_all(dir);
  }
  httplib::Client client() {
    httplib::Client c("127.0.0.1", srv->port());
    c.set_read_timeout(10, 0);
    return c;
  }
};

}  // namespace sieve::server
