// A tensor-parallel rank that fails while serving: the request in flight and every later one get
// 503, /health answers 503, and the engine records why (sieve serve then stops and exits 1).
// Two fake-model ranks on CPU threads; rank 1 throws when it is fed a given token.
#include <gtest/gtest.h>
#include <httplib.h>
#include <unistd.h>

#include <filesystem>
#include <memory>
#include <thread>

#include "../engine/fake_model.h"
#include "engine/rank_group.h"
#include "server/server.h"
#include "text/byte_level.h"
#include "text/tokenizer.h"

namespace sieve::server {
namespace {

TEST(ServerTensorParallel, ARankThatFailsAnswers503AndStopsTheEngine) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("sieve-server-tp-test-" + std::to_string(::getpid()));
  text::write_byte_level_tokenizer(dir.string(), 300);
  text::Tokenizer tok = text::Tokenizer::load(dir.string());
  engine::RankGroupOptions go;
  go.size = 2;
  engine::RankGroup group(std::move(go), [](int rank, const Device&, ops::Collective*) {
    auto m = std::make_unique<engine::testing::FakeModel>(300, 16);
    if (rank == 1) m->fail_on_token = 77;
    return m;
  });
  group.leader().allocate_caches({.num_blocks = 32});
  engine::Engine eng(
      group.leader(),
      engine::testing::engine_config({.max_num_batched_tokens = 64, .max_num_seqs = 8, .max_model_len = 256}, 32));
  ServerOptions so;
  so.port = 0;
  Server srv(eng, tok, so);
  srv.bind();
  eng.start();
  std::thread serving([&] { srv.run(); });
  httplib::Client c("127.0.0.1", srv.port());
  c.set_read_timeout(10, 0);

  // Greedy: a sampled token could be rank 1's failing one.
  auto ok = c.Post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":4,"temperature":0})", "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  auto bad = c.Post("/v1/completions", R"({"prompt":[1,77,3],"max_tokens":4})", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 503) << bad->body;
  EXPECT_NE(bad->body.find("rank 1 failed"), std::string::npos) << bad->body;
  EXPECT_NE(eng.stats().fatal_error, "");
  auto after =
      c.Post("/v1/completions", R"({"prompt":[1,2,3],"max_tokens":4,"temperature":0})", "application/json");
  ASSERT_TRUE(after);
  EXPECT_EQ(after->status, 503) << after->body;
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503) << health->body;

  srv.shutdown();
  serving.join();
  eng.stop();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sieve::server
