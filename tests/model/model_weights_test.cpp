// Weight formats, rank layouts, dummy weights and the memory estimate on the CPU: FP8
// checkpoints (MXFP8, Hugging Face 128x128 blocks, --quantization fp8) against the exactly
// dequantized reference, bad checkpoints named in one error, and one rank's shard.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/runner.h"
#include "io/config.h"
#include "io/safetensors.h"
#include "io/tiny_model.h"
#include "model/model.h"
#include "model/rank_layout.h"
#include "model/weights.h"

namespace sieve {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("sieve_weights_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

ModelConfig real_config(const std::string& overrides = "") {
  return load_model_config(std::string(SIEVE_SOURCE_DIR) + "/configs/minimax-m3", overrides);
}

// Logits of a prompt through the runner (one prefill step, every row).
std::vector<float> prefill_logits(model::Model& m, const std::vector<int32_t>& ids) {
  engine::Runner r(m);
  model::CacheOptions co;
  co.kv_dtype = co.index_dtype = DType::F32;
  co.num_blocks = int64_t(ids.size() + 127) / 128 + 1;
  m.allocate_caches(co);
  engine::StepInputs in;
  in.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    in.positions.push_back(int32_t(i));
    in.slot_mapping.push_back(int64_t(i));
    in.logits_indices.push_back(int32_t(i));
  }
  for (int64_t b = 0; b < co.num_blocks; ++b) in.block_tables.push_back(int32_t(b));
  in.max_blocks_per_seq = int(co.num_blocks);
  in.query_start_loc = {0, int32_t(ids.size())};
  in.seq_lens = {int32_t(ids.size())};
  std::vector<float> logits;
  r.run(in, logits);
  return logits;
}

std::vector<int32_t> ids_for(int n, int64_t vocab) {
  std::mt19937 rng(7);
  std::vector<int32_t> ids(static_cast<size_t>(n), 0);
  for (auto& x : ids) x = int32_t(rng() % uint32_t(vocab));
  return ids;
}

// --quantization fp8 quantizes each 128x128 block of the BF16 weights exactly as the Hugging
// Face fp8 layout stores them (scale = amax / 448), so a BF16 checkpoint quantized at load and
// the same weights written as an fp8 checkpoint give the same logits, bit for bit. (Dense MLP
// layers only: routed experts follow the MoE op's formats.)
TEST(ModelWeights, OnlineFp8EqualsTheBlockFp8Checkpoint) {
  TinyModelOptions o;
  o.seed = 3;
  o.moe_layers = {0, 0, 0, 0};
  o.hidden_size = 160;       // a partial 128-column block
  o.dense_intermediate = 200;  // and partial 128-row blocks, which the fused [gate | up] puts mid-weight
  const std::string bf = temp_dir("online_bf16"), fp = temp_dir("online_fp8");
  write_tiny_model(o, bf);
  o.quant = "fp8";
  write_tiny_model(o, fp);
  model::LoadOptions lo;
  lo.quantization = "fp8";
  auto online = model::Model::load(bf, lo);
  auto stored = model::Model::load(fp);
  auto plain = model::Model::load(bf);
  const auto ids = ids_for(150, online->vocab_size());
  const auto a = prefill_logits(*online, ids), b = prefill_logits(*stored, ids), c = prefill_logits(*plain, ids);
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(a, b);
  // And quantizing changed the weights (the comparison above is not of two BF16 models).
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - c[i])));
  EXPECT_GT(d, 1e-3);
  EXPECT_LT(online->weight_bytes(), plain->weight_bytes());
  fs::remove_all(bf);
  fs::remove_all(fp);
}

TEST(ModelWeights, QuantizationFlagErrors) {
  TinyModelOptions o;
  o.quant = "mxfp8";
  const std::string dir = temp_dir("qflag");
  write_tiny_model(o, dir);
  model::LoadOptions lo;
  lo.quantization = "fp8";
  std::string msg = error_of([&] { model::Model::load(dir, lo); });
  EXPECT_NE(msg.find("already quantized (mxfp8)"), std::string::npos) << msg;
  lo.quantization = "awq";
  msg = error_of([&] { model::Model::load(dir, lo); });
  EXPECT_NE(msg.find("--quantization awq is not supported"), std::string::npos) << msg;
  fs::remove_all(dir);
}

// Rewrites one tensor of a one-file checkpoint (the tensors as TensorToWrite).
void rewrite(const std::string& dir, const std::function<void(std::vector<TensorToWrite>&)>& edit) {
  std::vector<TensorToWrite> ts;
  {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    for (const auto& [name, t] : f->tensors()) {
      const uint8_t* p = static_cast<const uint8_t*>(t.data);
      ts.push_back(TensorToWrite{name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)});
    }
  }
  edit(ts);
  write_safetensors(dir + "/model.safetensors", ts);
}

TEST(ModelWeights, BadScalesAreNamed) {
  for (const std::string quant : {"mxfp8", "fp8"}) {
    TinyModelOptions o;
    o.quant = quant;
    const std::string dir = temp_dir("badscale_" + quant);
    write_tiny_model(o, dir);
    const std::string name = "language_model.model.layers.1.self_attn.o_proj.weight_scale_inv";
    rewrite(dir, [&](std::vector<TensorToWrite>& ts) {
      for (auto& t : ts)
        if (t.name == name) {
          t.shape = {t.shape[0] * t.shape[1]};  // the right bytes in the wrong shape
        }
    });
    std::string msg = error_of([&] { model::Model::load(dir); });
    EXPECT_NE(msg.find(name), std::string::npos) << msg;
    EXPECT_NE(msg.find("expected"), std::string::npos) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
    // A missing scale.
    rewrite(dir, [&](std::vector<TensorToWrite>& ts) {
      std::erase_if(ts, [&](const TensorToWrite& t) { return t.name == name; });
    });
    msg = error_of([&] { model::Model::load(dir); });
    EXPECT_NE(msg.find("has no " + name), std::string::npos) << msg;
    fs::remove_all(dir);
  }
}

// --fp8-scale-blocks 128x128: an MXFP8 checkpoint regrouped to one scale a 128 x 128 block on the
// CPU as on the GPU (so the CPU stays the oracle of the weights the GPU runs): logits close to the
// checkpoint's own 1 x 32 scales, the bytes estimated before allocating (file and dummy weights),
// and a bad value named.
TEST(ModelWeights, Mxfp8ScaleBlocks128) {
  TinyModelOptions o;
  o.quant = "mxfp8";
  o.seed = 17;
  const std::string dir = temp_dir("blocks128");
  write_tiny_model(o, dir);
  auto m0 = model::Model::load(dir);
  model::LoadOptions lo;
  lo.fp8_scale_blocks = "128x128";
  auto m1 = model::Model::load(dir, lo);
  const auto ids = ids_for(130, m0->vocab_size());
  const auto a = prefill_logits(*m0, ids), b = prefill_logits(*m1, ids);
  ASSERT_EQ(a.size(), b.size());
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(std::isfinite(b[i]));
    err2 += double(a[i] - b[i]) * double(a[i] - b[i]);
    ref2 += double(a[i]) * double(a[i]);
  }
  std::printf("[ blocks ] tiny MXFP8 model, 128x128 against 1x32 scales on the CPU: logits' relative RMS change %.3g\n",
              std::sqrt(err2 / ref2));
  EXPECT_LT(std::sqrt(err2 / ref2), 0.02);
  model::WeightOptions wo;
  wo.layout = model::RankLayout::make(m1->config(), 1, 0);
  wo.scale_blocks128 = true;
  const Checkpoint ck = Checkpoint::open(dir);
  EXPECT_EQ(m1->weight_bytes(), model::estimate_weight_bytes(m1->config(), wo, &ck));
  lo.load_format = "dummy";
  auto m2 = model::Model::load(dir, lo);
  EXPECT_EQ(m2->weight_bytes(), model::estimate_weight_bytes(m2->config(), wo, nullptr));
  lo.load_format = "auto";
  lo.fp8_scale_blocks = "64x64";
  const std::string msg = error_of([&] { model::Model::load(dir, lo); });
  EXPECT_NE(msg.find("--fp8-scale-blocks must be auto or 128x128"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(ModelWeights, Fp8TensorWithoutQuantizationConfigIsNamed) {
  TinyModelOptions o;
  o.quant = "mxfp8";
  const std::string dir = temp_dir("noqcfg");
  write_tiny_model(o, dir);
  nlohmann::json cfg;
  std::ifstream(dir + "/config.json") >> cfg;
  cfg.erase("quantization_config");
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  std::string msg = error_of([&] { model::Model::load(dir); });
  EXPECT_NE(msg.find("is F8_E4M3 but config.json has no quantization_config"), std::string::npos) << msg;
  fs::remove_all(dir);
}

TEST(RankLayout, SplitsTheRealModelAsTheSpecSays) {
  const ModelConfig c = real_config();
  const model::RankLayout one = model::RankLayout::make(c, 1, 0);
  EXPECT_EQ(one.q_heads, 64);
  EXPECT_EQ(one.kv_heads, 4);
  EXPECT_EQ(one.vocab, 200064);
  // TP4: 16 q heads, 1 kv head, 1 index head each (spec §6: packed row 2560 with index_k).
  for (int r = 0; r < 4; ++r) {
    const model::RankLayout l = model::RankLayout::make(c, 4, r);
    EXPECT_EQ(l.q_heads, 16);
    EXPECT_EQ(l.q_head0, 16 * r);
    EXPECT_EQ(l.kv_heads, 1);
    EXPECT_EQ(l.kv_head0, r);
    EXPECT_EQ(l.index_heads, 1);
    EXPECT_EQ(l.index_head0, r);
    EXPECT_EQ((l.q_heads + 2 * l.kv_heads + l.index_heads + 1) * 128, 2560);
    EXPECT_EQ(l.expert_inter, 768);
    EXPECT_EQ(l.expert_inter0, 768 * r);
    EXPECT_EQ(l.dense_inter, 3072);
    EXPECT_EQ(l.vocab, 50016);
  }
  // TP8: kv heads replicated over pairs of ranks, whose query heads are that kv head's group.
  for (int r = 0; r < 8; ++r) {
    const model::RankLayout l = model::RankLayout::make(c, 8, r);
    EXPECT_EQ(l.q_heads, 8);
    EXPECT_EQ(l.kv_heads, 1);
    EXPECT_EQ(l.kv_head0, r / 2);
    EXPECT_EQ(l.q_head0 / 16, l.kv_head0);  // 16 q heads per kv head
    EXPECT_EQ(l.expert_inter, 384);
  }
  std::string msg = error_of([&] { model::RankLayout::make(c, 3, 0); });
  EXPECT_NE(msg.find("does not split over 3"), std::string::npos) << msg;
  msg = error_of([&] { model::RankLayout::make(c, 8, 8); });
  EXPECT_NE(msg.find("rank 8"), std::string::npos) << msg;
}

// One rank's shard loaded from the full checkpoint holds exactly that rank's slices: rank 1 of
// 2 computes the same q heads, kv heads and intermediate columns the layout names. Checked
// through the sizes of what it loads and its forward running.
TEST(RankLayout, LoadsOnlyTheRanksSlices) {
  TinyModelOptions o;
  o.seed = 9;
  const std::string dir = temp_dir("shard");
  write_tiny_model(o, dir);
  auto whole = model::Model::load(dir);
  model::LoadOptions lo;
  lo.tp_size = 2;
  lo.tp_rank = 1;
  auto half = model::Model::load(dir, lo);
  EXPECT_LT(half->weight_bytes(), whole->weight_bytes() * 7 / 10);
  EXPECT_GT(half->weight_bytes(), whole->weight_bytes() * 4 / 10);
  // The shard's forward runs (ids inside its half of the vocabulary, the ones its embedding rows
  // hold) and writes its vocabulary columns, the second half of every row, with finite values.
  const int64_t V = half->vocab_size();
  std::vector<int32_t> ids = ids_for(40, V / 2);
  for (int32_t& id : ids) id += int32_t(V / 2);
  const auto logits = prefill_logits(*half, ids);
  size_t nonzero = 0;
  for (size_t r = 0; r < logits.size() / size_t(V); ++r)
    for (int64_t v = V / 2; v < V; ++v) {
      const float x = logits[r * size_t(V) + size_t(v)];
      ASSERT_TRUE(std::isfinite(x));
      nonzero += x != 0;
    }
  EXPECT_GT(nonzero, logits.size() / 4);
  fs::remove_all(dir);
}

TEST(DummyWeights, RunWithoutWeightFiles) {
  TinyModelOptions o;
  o.quant = "mxfp8";
  const std::string dir = temp_dir("dummy");
  write_tiny_model(o, dir);
  fs::remove(fs::path(dir) / "model.safetensors");
  model::LoadOptions lo;
  lo.load_format = "dummy";
  auto m = model::Model::load(dir, lo);
  const auto logits = prefill_logits(*m, ids_for(130, m->vocab_size()));
  for (float v : logits) ASSERT_TRUE(std::isfinite(v));
  // The same bytes as the estimate made before allocating.
  model::WeightOptions wo;
  wo.layout = model::RankLayout::make(m->config(), 1, 0);
  EXPECT_EQ(m->weight_bytes(), model::estimate_weight_bytes(m->config(), wo, nullptr));
  fs::remove_all(dir);
}

TEST(DummyWeights, MissingShapeKeyIsNamed) {
  const std::string dir = temp_dir("dummy_missing");
  nlohmann::json cfg;
  std::ifstream(std::string(SIEVE_SOURCE_DIR) + "/configs/minimax-m3/config.json") >> cfg;
  cfg["text_config"].erase("intermediate_size");
  std::ofstream(dir + "/config.json") << cfg.dump(2);
  model::LoadOptions lo;
  lo.load_format = "dummy";
  lo.hf_overrides = R"({"num_hidden_layers": 4})";
  const std::string msg = error_of([&] { model::Model::load(dir, lo); });
  EXPECT_NE(msg.find("--load-format dummy"), std::string::npos) << msg;
  EXPECT_NE(msg.find("text_config.intermediate_size"), std::string::npos) << msg;
  lo.load_format = "pt";
  EXPECT_NE(error_of([&] { model::Model::load(dir, lo); }).find("--load-format pt is not supported"), std::string::npos);
  fs::remove_all(dir);
}

// What one rank of the real model holds on a GPU: about the published MXFP8 checkpoint's size
// over the ranks (444 GB in all), and at most 1.1 x the checkpoint bytes of its tensors.
TEST(MemoryEstimate, RealModelPerRank) {
  const ModelConfig c = real_config();
  model::WeightOptions wo;
  wo.device = Device{DeviceKind::CUDA, 0};
  const double gb = 1e9;
  for (int tp : {4, 8}) {
    wo.layout = model::RankLayout::make(c, tp, 0);
    const double bytes = double(model::estimate_weight_bytes(c, wo, nullptr));
    std::printf("[ memory ] MiniMax-M3 MXFP8, one rank of %d on CUDA: %.1f GB of weights\n", tp, bytes / gb);
    if (!model::experts_take_fp8()) continue;
    EXPECT_LT(bytes, 444e9 * 1.1 / tp + 2.5e9);  // + the replicated kv heads, index keys and norms
    EXPECT_GT(bytes, 444e9 / tp * 0.9);
  }
  if (!model::experts_take_fp8()) GTEST_SKIP() << "routed experts are not FP8 until ops::moe_experts takes FP8";
}

// A tiny FP8 checkpoint's weights on a GPU take at most 1.1 x its files (estimated here; the GPU
// test checks the allocation).
TEST(MemoryEstimate, Fp8CheckpointWithinATenthOfItsFiles) {
  if (!model::experts_take_fp8()) GTEST_SKIP() << "routed experts are not FP8 until ops::moe_experts takes FP8";
  for (const std::string quant : {"mxfp8", "fp8"}) {
    TinyModelOptions o;
    o.quant = quant;
    o.hidden_size = 256;
    o.head_dim = 128;
    o.index_dim = 128;
    o.rotary_dim = 64;
    o.vocab_size = 256;
    o.expert_intermediate = 256;
    o.shared_intermediate = 256;
    o.dense_intermediate = 512;
    const std::string dir = temp_dir("mem_" + quant);
    write_tiny_model(o, dir);
    const ModelConfig c = load_model_config(dir);
    model::WeightOptions wo;
    wo.device = Device{DeviceKind::CUDA, 0};
    wo.layout = model::RankLayout::make(c, 1, 0);
    const Checkpoint ck = Checkpoint::open(dir);
    const double est = double(model::estimate_weight_bytes(c, wo, &ck));
    const double files = double(fs::file_size(fs::path(dir) / "model.safetensors"));
    std::printf("[ memory ] tiny %s: %.0f bytes on CUDA, %.0f in the file (%.3f x)\n", quant.c_str(), est, files,
                est / files);
    EXPECT_LE(est, 1.1 * files) << quant;
    fs::remove_all(dir);
  }
}

TEST(CudaShapes, UnsupportedShapesAreNamed) {
  TinyModelOptions o;  // head_dim 64
  const ModelConfig c = tiny_model_config(o);
  const std::string why = model::cuda_shape_problem(c);
  EXPECT_NE(why.find("head_dim = 64"), std::string::npos) << why;
  EXPECT_NE(why.find("128"), std::string::npos) << why;
  EXPECT_EQ(model::cuda_shape_problem(real_config()), "");
}

}  // namespace
}  // namespace sieve

namespace sieve {
// Weights on a GPU are views into shared allocations (a CUDA allocation takes whole 2 MiB pages).
TEST(BufferView, SharesItsParentsBytesAndFreesNothing) {
  Buffer parent(Device{}, 1000);
  for (int i = 0; i < 1000; ++i) parent.as<uint8_t>()[i] = uint8_t(i * 7 + 3);
  Buffer v = Buffer::view_of(parent, 256, 100);
  EXPECT_EQ(v.bytes(), 100u);
  EXPECT_EQ(v.as<uint8_t>(), parent.as<uint8_t>() + 256);
  Buffer moved = std::move(v);
  EXPECT_EQ(moved.as<uint8_t>()[5], uint8_t(261 * 7 + 3));
  moved = Buffer();  // releasing a view leaves the parent's bytes alone
  EXPECT_EQ(parent.as<uint8_t>()[261], uint8_t(261 * 7 + 3));
  EXPECT_THROW(Buffer::view_of(parent, 900, 101), Error);
}
}  // namespace sieve
