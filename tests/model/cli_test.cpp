// The model commands of the `sieve` binary (generate, serve): where they run (--device) and what
// they refuse.
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kernels/memory.h"
#include "sieve_cli_util.h"

namespace sieve {
namespace {

// stderr too: the errors are what these tests read.
testing::CliResult run_sieve(const std::string& args) { return testing::run_sieve(args, true); }

const char* kGenerate = "generate --prompt-ids 5,6,7,8 --max-tokens 3 --json";

TEST(ModelCli, GenerateOnTheCpu) {
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cpu");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"token_ids\""), std::string::npos) << r.out;
}

TEST(ModelCli, BadDeviceValuesAreUserErrors) {
  for (const char* bad : {"gpu", "cuda:x", "cuda:", "cuda:99999"}) {
    testing::CliResult r = run_sieve(std::string(kGenerate) + " --device " + bad);
    EXPECT_EQ(r.rc, 2) << bad << ": " << r.out;
    EXPECT_NE(r.out.find("--device"), std::string::npos) << bad << ": " << r.out;
  }
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda:64");
  EXPECT_EQ(r.rc, 2) << r.out;
  if (cuda_device_count() == 0) {
    testing::CliResult c = run_sieve(std::string(kGenerate) + " --device cuda");
    EXPECT_EQ(c.rc, 2) << c.out;
    EXPECT_NE(c.out.find("no CUDA device"), std::string::npos) << c.out;
  }
}

// -tp on the CPU: thread ranks, the same greedy tokens as one rank (log-probs within fp32
// summation-order tolerance), with and without expert parallelism.
TEST(ModelCli, TensorParallelGenerateOnCpuThreads) {
  auto tokens = [](const std::string& extra) {
    // fp32 caches: a bf16 cache would round the ranks' last-bit differences in k and v further.
    testing::CliResult r = run_sieve(std::string(kGenerate) + " --max-tokens 6 --device cpu --kv-cache-dtype fp32 " + extra);
    EXPECT_EQ(r.rc, 0) << extra << ": " << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.rfind("\n{") + 1), nullptr, false);
    EXPECT_FALSE(j.is_discarded()) << r.out;
    return j;
  };
  const nlohmann::json one = tokens("");
  for (const std::string extra : {"-tp 2", "--tensor-parallel-size 4", "-tp 2 --enable-expert-parallel"}) {
    const nlohmann::json j = tokens(extra);
    EXPECT_EQ(j["token_ids"], one["token_ids"]) << extra;
    for (size_t i = 0; i < one["logprobs"].size(); ++i)
      EXPECT_NEAR(j["logprobs"][i].get<double>(), one["logprobs"][i].get<double>(), 1e-4) << extra;
  }
}

// -tp values the model does not split into, and more ranks than GPUs: exit 2 naming the numbers.
TEST(ModelCli, TensorParallelSizesThatDoNotFitAreUserErrors) {
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"-tp 3 --device cpu", "--tensor-parallel-size 3: "},
           {"-tp 3 --device cpu", "num_attention_heads = 4 does not split over 3"},
           {"-tp 8 --device cpu", "num_attention_heads = 4 does not split over 8"},
           {"-tp 0 --device cpu", "--tensor-parallel-size must be in 1..64"},
           {"-tp 2 --device cpu --hf-overrides '{\"num_local_experts\": 7}' --enable-expert-parallel",
            "num_local_experts = 7 does not split over 2"},
           {"-tp 2 --device cpu --nnodes 2", "--nnodes 2 needs --dist-init-addr"},
           {"-tp 2 --device cpu --dist-timeout 0", "--dist-timeout"}}) {
    testing::CliResult r = run_sieve(std::string(kGenerate) + " " + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
  }
  const int gpus = cuda_device_count();
  if (gpus > 0) {
    const std::string n = std::to_string(gpus * 2 > 4 ? 4 : gpus * 2);
    testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda -tp " + n);
    EXPECT_EQ(r.rc, 2) << r.out;
    EXPECT_NE(r.out.find("CUDA devices (one per rank), but this machine has"), std::string::npos) << r.out;
  }
}

// Two processes of a two-node run meet over loopback (the rendezvous hands node 1 the NCCL group
// id) and then each stops where it needs its GPUs, with a message; a node that never comes is a
// timeout, not a hang.
TEST(ModelCli, TwoNodesMeetOverLoopbackThenNeedTheirGpus) {
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  const std::string common = std::string(kGenerate) + " -tp 2 --nnodes 2 --dist-timeout 30 --dist-init-addr 127.0.0.1:" + port;
  testing::CliResult node1;
  std::thread t([&] { node1 = run_sieve(common + " --node-rank 1"); });
  testing::CliResult node0 = run_sieve(common + " --node-rank 0");
  t.join();
  for (const testing::CliResult* r : {&node0, &node1}) {
    EXPECT_NE(r->out.find("rendezvous: node"), std::string::npos) << r->out;
    EXPECT_EQ(r->rc, 2) << r->out;
    if (cuda_device_count() == 0) {
      EXPECT_NE(r->out.find("needs 1 CUDA device(s) for its ranks"), std::string::npos) << r->out;
    }
  }
  testing::CliResult alone = run_sieve(std::string(kGenerate) + " -tp 2 --nnodes 2 --dist-timeout 1 --node-rank 0 "
                                       "--dist-init-addr 127.0.0.1:" + std::to_string(20000 + (::getpid() + 1) % 20000));
  EXPECT_EQ(alone.rc, 2) << alone.out;
  EXPECT_NE(alone.out.find("did not join"), std::string::npos) << alone.out;
}

// vLLM's serving flags that Sieve takes: a wrong value is refused at start, before the weights
// load, with a message that names the flag.
TEST(ModelCli, SelectionLocalityOfTheBundledModel) {
  // At the model's own shape the recomputed selections must be the model's.
  testing::CliResult r = run_sieve("eval selections --device cpu --tokens 700");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("all layers"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("recomputed = the model's selection on 1.0000"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("tiled sparse prefill passes"), std::string::npos) << r.out;
  r = run_sieve("eval selections --device cpu --tokens 700 --block-size 0");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--block-size"), std::string::npos) << r.out;
}

TEST(ModelCli, ServeFlagErrorsNameTheFlag) {
#ifndef SIEVE_TEST_HAVE_SERVER
  GTEST_SKIP() << "this build has no server (cpp-httplib or pcre2 missing)";
#endif
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--dtype float16", "--dtype float16 is not supported"},
           {"--max-logprobs -1", "--max-logprobs"},
           {"--seed -3", "--seed"},
           {"--generation-config /no/such/dir", "--generation-config /no/such/dir: no generation_config.json"},
           {"--override-generation-config '{\"top_p\": 0}'", "--override-generation-config top_p"},
           {"--override-generation-config 'nope'", "--override-generation-config: not valid JSON"},
           {"--chat-template /no/such.jinja", "--chat-template"},
           {"--enable-auto-tool-choice", "--enable-auto-tool-choice needs --tool-call-parser"},
           {"--enable-auto-tool-choice --tool-call-parser hermes", "--tool-call-parser hermes is unknown"},
           {"--reasoning-parser nope", "--reasoning-parser nope is unknown"}}) {
    testing::CliResult r = run_sieve("serve --device cpu --port 0 " + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
  }
}

// The published config at a small width, with weights made at load (no weight file): the flag
// combinations a user can get wrong answer with one line and exit 2.
const std::string kSmallM3 =
    std::string("--model ") + SIEVE_SOURCE_DIR +
    "/configs/minimax-m3 --device cpu --prompt-ids 1,2,3 --max-tokens 2 --hf-overrides '{\"num_hidden_layers\": 4, "
    "\"hidden_size\": 256, \"intermediate_size\": 64, \"dense_intermediate_size\": 128, "
    "\"shared_intermediate_size\": 64, \"num_attention_heads\": 8, \"vocab_size\": 512, "
    "\"num_local_experts\": 8}'";

TEST(ModelCli, DummyWeightsOfThePublishedConfig) {
  testing::CliResult r = run_sieve("generate --load-format dummy --json " + kSmallM3);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("\"token_ids\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("mxfp8, dummy values"), std::string::npos) << r.out;
  // The MXFP8 scales regrouped to 128 x 128 blocks.
  testing::CliResult b = run_sieve("generate --load-format dummy --fp8-scale-blocks 128x128 --json " + kSmallM3);
  ASSERT_EQ(b.rc, 0) << b.out;
  EXPECT_NE(b.out.find("scales regrouped to 128x128 blocks"), std::string::npos) << b.out;
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--load-format dummy --quantization fp8", "already quantized (mxfp8)"},
           {"--load-format dummy --quantization int4", "--quantization int4 is not supported"},
           {"--load-format tensorizer", "--load-format tensorizer is not supported"},
           {"--load-format dummy --fp8-scale-blocks 64x64", "--fp8-scale-blocks must be auto or 128x128"}}) {
    testing::CliResult e = run_sieve("generate " + args + " " + kSmallM3);
    EXPECT_EQ(e.rc, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(needle), std::string::npos) << args << ": " << e.out;
    EXPECT_EQ(e.out.find('\n'), e.out.size() - 1) << "one line: " << e.out;
  }
}

// bench step on the bundled model (CPU): every family, the step against its floor, the
// projection for 4 ranks (the tiny model's 4 heads and 2 kv heads split over 2 ranks).
TEST(ModelCli, BenchStepReportsEveryFamily) {
  testing::CliResult r = run_sieve(std::string("bench step --model ") + SIEVE_SOURCE_DIR +
                                   "/models/minimax-m3-tiny --load-format auto --device cpu --batch 3 --context 300 "
                                   "--prefill 130 --iters 1 --kv-cache-dtype bf16 --tp-rank-of 2 --ops --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t open = r.out.find("{\n");
  ASSERT_NE(open, std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(open));
  for (const char* part : {"decode", "prefill"}) {
    ASSERT_TRUE(j.contains(part)) << r.out;
    const auto& fams = j[part]["families"];
    ASSERT_EQ(fams.size(), std::string(part) == "decode" ? 8u : 6u) << r.out;  // decode: and sampling (device, host)
    double sum = 0;
    for (const auto& f : fams) {
      EXPECT_GE(f["time_ms"].get<double>(), 0.0);
      EXPECT_GT(f["bytes"].get<double>(), 0.0) << f.dump();
      sum += f["time_ms"].get<double>();
    }
    EXPECT_GT(sum, 0.0);
    // --ops: each op name with its calls; their times add up to the families'.
    ASSERT_TRUE(j[part].contains("ops")) << r.out;
    double ops_sum = 0;
    for (const auto& o : j[part]["ops"]) {
      EXPECT_GT(o["calls"].get<int>(), 0) << o.dump();
      ops_sum += o["ms"].get<double>();
    }
    double eager_sum = 0;
    for (const auto& f : fams)
      if (f["family"].get<std::string>().rfind("sampling", 0) != 0) eager_sum += f["time_ms"].get<double>();
    EXPECT_NEAR(ops_sum, eager_sum, 1e-6 + 1e-6 * eager_sum) << r.out;
    EXPECT_GT(j[part]["step_ms"].get<double>(), 0.0);
    EXPECT_GT(j[part]["floor_ms"].get<double>(), 0.0);
  }
  EXPECT_EQ(j["tp_rank_of"], 2);
  EXPECT_EQ(j["projection"]["allreduces"], 12);  // 2 per layer of 6
  // The prefill chunk's projection: its 12 all-reduces of 130 rows each.
  EXPECT_GT(j["prefill"]["comm_ms"].get<double>(), 0.0);
  EXPECT_NEAR(j["prefill"]["projected_ms"].get<double>(),
              j["prefill"]["step_ms"].get<double>() + j["prefill"]["comm_ms"].get<double>(), 1e-9);
  EXPECT_GT(j["projected_tpot_ms"].get<double>(), j["decode"]["step_ms"].get<double>());
}

// bench step --layers A:B: layers A .. B - 1 of the model's layout timed as a model of B - A layers
// (a rank too large for one GPU in pieces); bad ranges are one line and exit 2.
TEST(ModelCli, BenchStepTimesALayerRange) {
  const std::string base = std::string("bench step --model ") + SIEVE_SOURCE_DIR +
                           "/models/minimax-m3-tiny --device cpu --batch 2 --context 200 "
                           "--prefill 0 --iters 1 --tp-rank-of 2";
  testing::CliResult r = run_sieve(base + " --layers 1:4 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const size_t open = r.out.find("{\n");
  ASSERT_NE(open, std::string::npos) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(open));
  EXPECT_EQ(j["layers"], nlohmann::json::array({1, 4})) << r.out;
  EXPECT_EQ(j["projection"]["allreduces"], 6);  // 2 per layer of 3
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--layers 4:2", "expected 0 <= A < B <= num_hidden_layers = 6"},
           {"--layers 0:7", "expected 0 <= A < B <= num_hidden_layers = 6"},
           {"--layers 3", "expected A:B"},
           {"--layers 1:2x", "expected A:B"},
           {"--layers 1:3 --hf-overrides '{\"num_hidden_layers\": 2}'", "give one"},
           {"--layers 1:3 --load-format auto", "--layers needs --load-format dummy"}}) {
    testing::CliResult e = run_sieve(base + " " + args);
    EXPECT_EQ(e.rc, 2) << args << ": " << e.out;
    EXPECT_NE(e.out.find(needle), std::string::npos) << args << ": " << e.out;
    EXPECT_EQ(e.out.find('\n'), e.out.size() - 1) << "one line: " << e.out;
  }
}

// bench step with --speculative-config (CPU): the verification step of K + 1 rows, the draft's
// passes (an EAGLE3 draft of the published shape, unsharded on the rank), and speedups that follow
// from those times at every acceptance length up to K + 1.
TEST(ModelCli, BenchStepTimesSpeculation) {
  const std::string base = std::string("bench step --model ") + SIEVE_SOURCE_DIR +
                           "/models/minimax-m3-tiny --load-format auto --device cpu --batch 3 --context 300 "
                           "--prefill 0 --iters 1 --kv-cache-dtype bf16 --json ";
  struct Case {
    std::string args;
    bool eagle3;
    std::vector<double> lengths;
  } cases[] = {
      {"--tp-rank-of 2 --speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}'", true,
       {1.5, 2.0, 2.5, 3.0, 3.2, 4.0}},
      {"--speculative-config '{\"method\": \"ngram\", \"num_speculative_tokens\": 2}'", false,
       {1.5, 2.0, 2.5, 3.0}},
  };
  for (const Case& c : cases) {
    testing::CliResult r = run_sieve(base + c.args);
    ASSERT_EQ(r.rc, 0) << c.args << ": " << r.out;
    const size_t open = r.out.find("{\n");
    ASSERT_NE(open, std::string::npos) << r.out;
    const nlohmann::json j = nlohmann::json::parse(r.out.substr(open));
    ASSERT_TRUE(j.contains("speculative")) << r.out;
    const nlohmann::json& sp = j["speculative"];
    EXPECT_EQ(sp["method"], c.eagle3 ? "eagle3" : "ngram");
    const nlohmann::json& v = sp["verify"];
    ASSERT_EQ(v["families"].size(), 6u) << v.dump();
    for (const auto& f : v["families"]) EXPECT_GT(f["bytes"].get<double>(), 0.0) << f.dump();
    EXPECT_GT(v["step_ms"].get<double>(), 0.0);
    // K + 1 rows a sequence move more bytes than the plain step's one.
    EXPECT_GT(v["bytes"].get<double>(), j["decode"]["bytes"].get<double>());
    EXPECT_DOUBLE_EQ(sp["plain_step_ms"].get<double>(), j["decode"]["step_ms"].get<double>());
    const double plain = sp["plain_step_ms"], verify = sp["verify_step_ms"], draft = sp["draft_ms"];
    if (c.eagle3) {
      const nlohmann::json& d = sp["draft"];
      EXPECT_EQ(d["hidden_size"], 256);  // the target's
      EXPECT_EQ(d["num_attention_heads"], 64);
      EXPECT_EQ(d["draft_vocab_size"], 6144);
      EXPECT_EQ(d["aux_layers"], nlohmann::json({2, 3, 3}));  // (2, n/2, n-3) of 6 layers
      EXPECT_EQ(d["unsharded"], true);
      EXPECT_GT(draft, 0.0);
      EXPECT_GE(d["propose_ms"].get<double>(), draft);
    } else {
      EXPECT_TRUE(sp["draft"].is_null());
      EXPECT_EQ(draft, 0.0);
    }
    ASSERT_EQ(sp["speedup"].size(), c.lengths.size()) << sp.dump();
    for (size_t i = 0; i < c.lengths.size(); ++i) {
      const nlohmann::json& row = sp["speedup"][i];
      const double L = c.lengths[i];
      EXPECT_DOUBLE_EQ(row["acceptance_length"].get<double>(), L);
      EXPECT_NEAR(row["forwards"].get<double>(), L * plain / (verify + draft), 1e-9);
      EXPECT_NEAR(row["steps"].get<double>(),
                  L * sp["plain_tpot_ms"].get<double>() / sp["spec_step_ms"].get<double>(), 1e-9);
    }
  }
}

TEST(ModelCli, BenchStepSpeculationErrorsAreOneLine) {
  const std::string base = std::string("bench step --model ") + SIEVE_SOURCE_DIR +
                           "/models/minimax-m3-tiny --load-format auto --device cpu --batch 2 --context 200 "
                           "--prefill 0 --iters 1 ";
  for (const auto& [args, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--speculative-config '{\"method\": \"medusa\", \"num_speculative_tokens\": 3}'",
            "unknown method \"medusa\""},
           {"--speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 17}'",
            "num_speculative_tokens must be in 1..16"},
           {"-tp 2 --speculative-config '{\"method\": \"eagle3\", \"num_speculative_tokens\": 3}'",
            "does not run in a tensor-parallel group"}}) {
    testing::CliResult r = run_sieve(base + args);
    EXPECT_EQ(r.rc, 2) << args << ": " << r.out;
    EXPECT_NE(r.out.find("--speculative-config"), std::string::npos) << args << ": " << r.out;
    EXPECT_NE(r.out.find(needle), std::string::npos) << args << ": " << r.out;
    EXPECT_EQ(r.out.find('\n'), r.out.size() - 1) << "one line: " << r.out;
  }
}

// The side stream is on by default; --no-side-stream turns it off, --side-stream (the default,
// still accepted) beside it is one line and exit 2. On the CPU both run the one-stream order.
TEST(ModelCli, SideStreamFlags) {
  for (const char* flag : {" --side-stream", " --no-side-stream"}) {
    testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cpu" + flag);
    EXPECT_EQ(r.rc, 0) << flag << ": " << r.out;
  }
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cpu --side-stream --no-side-stream");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("--no-side-stream"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("give one"), std::string::npos) << r.out;
}

TEST(ModelCli, Fp32CacheOnCudaIsRefused) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  testing::CliResult r = run_sieve(std::string(kGenerate) + " --device cuda --kv-cache-dtype fp32");
  EXPECT_EQ(r.rc, 2) << r.out;
  EXPECT_NE(r.out.find("fp32 caches"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace sieve
