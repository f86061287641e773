// `sieve bench step`: one engine step of a model at its real shapes, as one tensor-parallel rank
// runs it (communication left out and projected): a decode step of --batch sequences at
// --context tokens replayed from a CUDA graph, and a --prefill token chunk. Per op family
// (dense attention, indexer, sparse attention, GEMMs, MoE, norms and the rest, sampling) the
// time of an eager run (events around every op), the bytes or FLOPs the family must move or
// compute, the floor those take at the device's rates, and the ratio; then the step against its
// bytes floor and the time per output token projected for N ranks. With --speculative-config,
// a verification step of K + 1 rows per sequence and the EAGLE3 draft's K passes after it, timed
// as serving runs them, and the speedup they give at a range of mean acceptance lengths.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/command.h"
#include "cli/model_bench_step_timing.h"
#include "cli/model_load_flags.h"
#include "core/error.h"
#include "core/log.h"
#include "engine/runner.h"
#include "engine/sampler.h"
#include "engine/speculation.h"
#include "engine/workers.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "model/rank_layout.h"
#include "model/weights.h"
#include "spec/config.h"
#include "spec/eagle3.h"

#ifdef SIEVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sieve::cli {
namespace {

// --layers A:B: the overrides that keep layers A .. B - 1 of the model's per-layer lists (its MoE
// and sparse-attention layout) as a model of B - A layers, from `text` (the text config after the
// user's overrides).
nlohmann::json layer_range_overrides(const std::string& spec, nlohmann::json text, int* first, int* last) {
  const size_t colon = spec.find(':');
  int a = -1, b = -1;
  try {
    size_t ua = 0, ub = 0;
    if (colon == std::string::npos) throw std::invalid_argument("no colon");
    a = std::stoi(spec.substr(0, colon), &ua);
    b = std::stoi(spec.substr(colon + 1), &ub);
    if (ua != colon || ub != spec.size() - colon - 1) throw std::invalid_argument("trailing");
  } catch (const std::exception&) {
    throw Error("--layers " + spec + ": expected A:B, the first layer and one past the last (e.g. 30:60)");
  }
  const int n = text.contains("num_hidden_layers") && text["num_hidden_layers"].is_number_integer()
                    ? text["num_hidden_layers"].get<int>()
                    : 0;
  if (a < 0 || b <= a || b > n)
    throw Error("--layers " + spec + ": expected 0 <= A < B <= num_hidden_layers = " + std::to_string(n));
  nlohmann::json ov = {{"num_hidden_layers", b - a}};
  // Flat keys: the config loader puts the sparse ones into sparse_attention_config.
  for_each_layer_list(text, [&](nlohmann::json& holder, const char* key) {
    if (!holder.contains(key)) return;
    const nlohmann::json& v = holder[key];
    if (!v.is_array() || int(v.size()) != n)
      throw Error(std::string("--layers: the config's ") + key + " is not a list of num_hidden_layers entries");
    nlohmann::json out = nlohmann::json::array();
    for (int i = a; i < b; ++i) out.push_back(v[size_t(i)]);
    ov[key] = out;
  });
  *first = a;
  *last = b;
  return ov;
}

// The step's default overrides (index sharing every 4 sparse layers, and --layers' slice) merged
// under the user's.
std::string bench_step_overrides(const std::string& user, const nlohmann::json& layers = nlohmann::json::object()) {
  nlohmann::json ov = {{"use_index_cache", true}, {"index_topk_freq", 4}};
  ov.update(layers);
  if (user.empty()) return ov.dump();
  nlohmann::json u;
  try {
    u = nlohmann::json::parse(user);
  } catch (const nlohmann::json::exception&) {
    return user;  // the config loader names the error
  }
  if (!u.is_object()) return user;
  const nlohmann::json* flat = u.contains("text_config") && u["text_config"].is_object() ? &u["text_config"] : &u;
  for (const char* k : {"use_index_cache", "index_topk_freq"})
    if (u.contains(k) || flat->contains(k)) ov.erase(k);
  ov.update(u);
  return ov.dump();
}

using nlohmann::json;
using step_timing::clock_type;
using step_timing::Marks;
using step_timing::median;
using step_timing::sampling_ms;
using step_timing::StepTimes;
using step_timing::time_steps;

const std::vector<std::string> kFamilies = {"dense attention", "indexer", "sparse attention", "GEMMs",
                                            "MoE", "norms and the rest"};

// What one step must move and compute, per family (the floors' inputs).
struct Cost {
  double bytes = 0, flops = 0;
};

struct StepShape {
  int64_t tokens = 0;            // new tokens
  std::vector<int64_t> q_keys;   // keys each new token attends (its position + 1)
  std::vector<int64_t> seq_ctx;  // keys of each sequence after the step
  int64_t logit_rows = 0;
};

// The bytes and FLOPs of each family for one rank's step, from the config, the rank layout and
// the weight and cache formats. Activations are counted at the dtypes the model uses (bf16
// between ops, fp32 residual, the sublayer outputs at `part_bytes` an element:
// Model::partials_dtype()'s size).
std::map<std::string, Cost> step_costs(const ModelConfig& c, const model::RankLayout& l, const StepShape& s,
                                       bool fp8_weights, bool fp8_experts, double kv_bytes, double index_bytes,
                                       double part_bytes) {
  std::map<std::string, Cost> f;
  const double H = double(c.hidden_size), hd = double(c.head_dim), idim = double(c.sparse_index_dim);
  const double B = double(s.tokens);
  auto wbytes = [](double rows, double cols, bool fp8) { return fp8 ? rows * cols * (1 + 4.0 / 128) : rows * cols * 2; };
  auto gemm = [&](double rows, double cols, double m, bool fp8) {
    Cost& g = f["GEMMs"];
    g.bytes += wbytes(rows, cols, fp8) + m * (rows + cols) * 2;
    g.flops += 2 * m * rows * cols;
  };
  double sum_keys = 0, sum_sparse_keys = 0, sum_ctx = 0;
  const double sel = double(c.sparse_topk_blocks) * c.sparse_block_size;
  for (int64_t k : s.q_keys) {
    sum_keys += double(k);
    sum_sparse_keys += std::min(double(k), sel);
  }
  for (int64_t k : s.seq_ctx) sum_ctx += double(k);
  // KV bytes of one key of one kv head (K and V, with fp8's per-token scales).
  const double kv_key = 2 * hd * kv_bytes + (kv_bytes == 1 ? 8 : 0);
  const double E = c.num_local_experts, k = c.num_experts_per_tok;
  for (int i = 0; i < c.num_hidden_layers; ++i) {
    const bool sparse = c.is_sparse_layer(i);
    const double qkv_rows = (l.q_heads + 2.0 * l.kv_heads) * hd + (sparse ? (l.index_heads + 1.0) * idim : 0);
    gemm(qkv_rows, H, B, fp8_weights);
    gemm(H, l.q_heads * hd, B, fp8_weights);
    Cost& rest = f["norms and the rest"];
    // The layer's two add + norms: each reads the sublayer output (part, at the partials' size)
    // and the fp32 residual, writes the residual back and its normed rows (bf16, as the GEMMs
    // count their inputs); the cache write reads and writes the qkv rows, writes the key and value.
    rest.bytes += B * (2 * H * (part_bytes + 4 + 4 + 2) + qkv_rows * 2 * 2) + B * l.kv_heads * kv_key;
    if (sparse) {
      rest.bytes += B * idim * index_bytes;
      if (!c.shares_index_topk(i)) {
        Cost& ix = f["indexer"];
        // Decode reads each sequence's index keys once; a prefill chunk is compute-bound.
        ix.bytes += sum_ctx * idim * index_bytes + B * l.index_heads * idim * 2;
        ix.flops += 2 * l.index_heads * idim * sum_keys;
      }
      // Each query's selected keys (a decode step), or the chunk's keys once (a prefill chunk).
      Cost& a = f["sparse attention"];
      a.bytes += std::min(sum_sparse_keys, sum_ctx) * l.kv_heads * kv_key + B * l.q_heads * hd * 2 * 2;
      a.flops += 4 * l.q_heads * hd * sum_sparse_keys;
    } else {
      Cost& a = f["dense attention"];
      a.bytes += sum_ctx * l.kv_heads * kv_key + B * l.q_heads * hd * 2 * 2;
      a.flops += 4 * l.q_heads * hd * sum_keys;
    }
    if (c.is_moe_layer(i)) {
      const double I = double(l.expert_inter);
      // Distinct experts the step's tokens touch under uniform routing.
      const double touched = E * (1 - std::pow(1 - k / E, B));
      // The rank's share of them and of the (token, expert) pairs: 1 unless expert-parallel.
      const double own = double(l.experts) / E;
      Cost& m = f["MoE"];
      m.bytes += own * (touched * wbytes(3 * I, H, fp8_experts) + B * k * (H * 4 + 2 * I * 2)) + E * H * 4;
      m.flops += own * 2 * B * k * 3 * I * H + 2 * B * E * H;
      if (l.shared_inter > 0) {
        gemm(2.0 * l.shared_inter, H, B, fp8_weights);
        gemm(H, double(l.shared_inter), B, fp8_weights);
      }
    } else {
      gemm(2.0 * l.dense_inter, H, B, fp8_weights);
      gemm(H, double(l.dense_inter), B, fp8_weights);
    }
  }
  gemm(double(l.vocab), H, double(s.logit_rows), false);  // lm_head (never quantized)
  f["norms and the rest"].bytes += B * H * 2;  // embedding rows
  return f;
}

// Classifies the ops of one eager step (in order) into families; attention ops take their
// layer's kind (one attention op per layer).
std::string family_of(const std::string& op, const ModelConfig& c, bool dense, int* attention_seen) {
  if (op == "attention") {
    const int layer = (*attention_seen)++;
    return c.is_sparse_layer(layer) && !dense ? "sparse attention" : "dense attention";
  }
  if (op == "indexer") return "indexer";
  if (op == "linear" || op == "matmul" || op == "quantize_fp8") return "GEMMs";
  if (op == "moe_experts" || op == "moe_route") return "MoE";
  return "norms and the rest";
}

// One op name's share of an eager step (--ops).
struct OpTotal {
  double ms = 0;
  int calls = 0;
};

// The --ops table: each op name's eager milliseconds and calls, largest first.
nlohmann::json ops_table(const std::string& title, const std::map<std::string, OpTotal>& by_op, bool print) {
  std::vector<std::pair<std::string, OpTotal>> v(by_op.begin(), by_op.end());
  std::sort(v.begin(), v.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  nlohmann::json out = nlohmann::json::array();
  if (print) std::printf("  %s\n  %-44s %10s %8s %10s\n", title.c_str(), "family / op", "ms", "calls", "us a call");
  for (const auto& [name, t] : v) {
    out.push_back({{"op", name}, {"ms", t.ms}, {"calls", t.calls}});
    if (print)
      std::printf("  %-44s %10.3f %8d %10.2f\n", name.c_str(), t.ms, t.calls, t.calls ? t.ms * 1e3 / t.calls : 0.0);
  }
  return out;
}

struct OpRecord {
  std::string op;
  int mark = 0;
};

// Runs `in` once eagerly with a mark after every op; returns each family's milliseconds (and,
// with by_op, each op name's).
std::map<std::string, double> per_family_ms(engine::Runner& r, const engine::StepInputs& in, const ModelConfig& c,
                                            bool dense, Marks& marks,
                                            std::map<std::string, OpTotal>* by_op = nullptr) {
  marks.clear();
  std::vector<OpRecord> ops;
  int start = -1;
  r.set_phase_observer([&](engine::Runner::Phase p) {
    if (p == engine::Runner::Phase::Uploaded) start = marks.mark();
  });
  // Called after each op is enqueued (CUDA) or has run (CPU): a mark there ends the op.
  ops::set_op_observer([&](const char* op, double, double) { ops.push_back({op, marks.mark()}); });
  std::vector<float> logits;
  try {
    r.run(in, logits);
  } catch (...) {
    ops::set_op_observer({});
    r.set_phase_observer({});
    throw;
  }
  ops::set_op_observer({});
  r.set_phase_observer({});
  std::map<std::string, double> ms;
  int attention_seen = 0;
  int prev = start;
  for (const OpRecord& o : ops) {
    const double t = marks.ms(prev, o.mark);
    const std::string fam = family_of(o.op, c, dense, &attention_seen);
    ms[fam] += t;
    if (by_op) {
      OpTotal& ot = (*by_op)[fam + " / " + o.op];
      ot.ms += t;
      ++ot.calls;
    }
    prev = o.mark;
  }
  return ms;
}

// Device-to-device copy bandwidth (read + write), GB/s.
double measure_copy_gbps(const Device& dev) {
#ifdef SIEVE_HAVE_CUDA
  if (dev.is_cuda()) {
    const size_t n = size_t(1) << 30;
    Buffer a(dev, n), b(dev, n);
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    cudaMemcpy(b.data(), a.data(), n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e0);
    for (int i = 0; i < 5; ++i) cudaMemcpyAsync(b.data(), a.data(), n, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    return 2.0 * 5 * double(n) / (double(ms) * 1e-3) / 1e9;
  }
#endif
  (void)dev;
  return 50.0;  // the CPU: a stated figure, not measured
}

std::string device_name(const Device& dev) {
#ifdef SIEVE_HAVE_CUDA
  cudaDeviceProp p{};
  if (dev.is_cuda() && cudaGetDeviceProperties(&p, dev.index) == cudaSuccess) return p.name;
#endif
  return dev.str();
}

struct Rates {
  double hbm_gbps = 0, fp8_tflops = 0, bf16_tflops = 0;
};

double floor_ms(const Cost& c, bool fp8, const Rates& r) {
  const double mem = c.bytes / (r.hbm_gbps * 1e9) * 1e3;
  const double math = c.flops / ((fp8 ? r.fp8_tflops : r.bf16_tflops) * 1e12) * 1e3;
  return std::max(mem, math);
}

json table(const std::string& title, const std::map<std::string, double>& ms, const std::map<std::string, Cost>& costs,
           const Rates& rates, bool fp8, bool fp8_experts, bool print) {
  json rows = json::array();
  if (print) {
    std::printf("\n%s\n", title.c_str());
    std::printf("  %-20s %10s %12s %12s %10s %8s\n", "family", "time ms", "GB", "TFLOP", "floor ms", "ratio");
  }
  double t_sum = 0, f_sum = 0, b_sum = 0;
  for (const std::string& fam : kFamilies) {
    const double t = ms.count(fam) ? ms.at(fam) : 0.0;
    const Cost c = costs.count(fam) ? costs.at(fam) : Cost{};
    const bool f8 = fam == "GEMMs" ? fp8 : fam == "MoE" ? fp8_experts : false;
    const double fl = floor_ms(c, f8, rates);
    t_sum += t;
    f_sum += fl;
    b_sum += c.bytes;
    rows.push_back({{"family", fam}, {"time_ms", t}, {"bytes", c.bytes}, {"flops", c.flops}, {"floor_ms", fl},
                    {"ratio", fl > 0 ? t / fl : 0.0}});
    if (print)
      std::printf("  %-20s %10.3f %12.3f %12.4f %10.3f %8.2f\n", fam.c_str(), t, c.bytes / 1e9, c.flops / 1e12, fl,
                  fl > 0 ? t / fl : 0.0);
  }
  if (print)
    std::printf("  %-20s %10.3f %12.3f %12s %10.3f %8.2f\n", "sum (eager ops)", t_sum, b_sum / 1e9, "", f_sum,
                f_sum > 0 ? t_sum / f_sum : 0.0);
  return rows;
}

// The published MiniMax-M3 EAGLE3 draft (Inferact/MiniMax-M3-EAGLE3; spec section 6): one Llama
// layer at the target's hidden size over the residual streams entering layers (2, n/2, n-3), with
// the target's vocabulary (it shares the target's embedding and lm_head vocabulary), about 3.3 B
// parameters with its embedding and lm_head. Its head counts and MLP width are not stated where
// this project reads: 64 heads of 128 over 8 kv heads and an MLP of 32768 make those 3.3 B. A
// draft directory ("model") gives any other shape.
spec::RandomEagle3Options published_draft_shape() {
  spec::RandomEagle3Options o;
  o.num_heads = 64;
  o.num_kv_heads = 8;
  o.head_dim = 128;
  o.intermediate_size = 32768;
  o.write_weights = false;
  return o;
}

struct BenchDraft {
  Buffer embed;  // a full embedding table for a rank's shard (declared first: outlives the draft)
  std::unique_ptr<spec::Eagle3Draft> draft;
  std::string source;
  double weight_bytes = 0;
};

// The EAGLE3 draft of the bench: the config.json of sc.model (its weights made up under
// --load-format dummy), else the published shape with made-up weights. A rank's shard holds 1/N of
// the target's embedding rows while the draft looks up any token, so there the draft gets a full
// table of its own (its values do not change the draft's time).
BenchDraft load_bench_draft(const spec::SpeculativeConfig& sc, const model::Model& m, bool dummy, long long tp) {
  namespace fs = std::filesystem;
  BenchDraft b;
  const ModelConfig& cfg = m.config();
  std::string dir = sc.model;
  fs::path tmp;
  if (dir.empty()) {
    tmp = fs::temp_directory_path() / ("sieve-bench-step-draft-" + std::to_string(getpid()));
    spec::write_random_eagle3(tmp.string(), cfg, published_draft_shape());
    dir = tmp.string();
    dummy = true;
    b.source = "the published MiniMax-M3 EAGLE3 shape, dummy weights";
  } else {
    b.source = dir + (dummy ? " (dummy weights)" : "");
  }
  ops::WeightView embed = m.input_embedding();
  if (tp > 1) {
    b.embed = Buffer(m.device(), size_t(cfg.vocab_size) * size_t(cfg.hidden_size) * 2);
    embed = {};
    embed.data = b.embed.data();
    embed.dtype = DType::BF16;
    embed.rows = cfg.vocab_size;
    embed.cols = cfg.hidden_size;
  }
  std::error_code ec;
  try {
    b.draft = spec::Eagle3Draft::load(dir, cfg, m.device(), embed, dummy);
  } catch (...) {
    if (!tmp.empty()) fs::remove_all(tmp, ec);
    throw;
  }
  if (!tmp.empty()) fs::remove_all(tmp, ec);
  const spec::Eagle3Config& c = b.draft->config();
  const double H = double(c.hidden_size), Ht = double(c.target_hidden_size), hd = double(c.head_dim);
  b.weight_bytes = 2 * (H * Ht * double(c.aux_layers.size()) + (c.num_heads + 2.0 * c.num_kv_heads) * hd * 2 * H +
                        H * c.num_heads * hd + 3 * H * double(c.intermediate_size) + double(c.draft_vocab_size) * H);
  return b;
}

int run_bench_step(const std::vector<std::string>& argv) {
  Args a("bench step", argv);
  a.opt({"--model"}, "DIR", "model directory (default: configs/minimax-m3, the published MiniMax-M3 config)")
      .opt({"--tp-rank-of", "--tp"}, "N",
           "run one rank's shard of N tensor-parallel ranks (rank 0) alone, its collectives projected", "1")
      .opt({"--batch"}, "N", "decode step: sequences", "32")
      .opt({"--context"}, "N", "decode step: tokens of each sequence after the step", "9216")
      .opt({"--prefill"}, "N", "prefill chunk: tokens (one sequence from position 0; 0 = none)", "8192")
      .opt({"--kv-cache-dtype"}, "DTYPE", "bf16 or fp8", "fp8")
      .opt({"--index-cache-dtype"}, "DTYPE", "bf16 or fp8 (default: the kv cache dtype)")
      .opt({"--iters"}, "N", "timed decode steps (prefill: N / 5, at least 2)", "20")
      .opt({"--allreduce-gbps"}, "GB/S",
           "all-reduce bus bandwidth for the projection (default 360: NCCL's all-reduce bus bandwidth on "
           "8 x H100/H200 SXM with NVLink 4 / NVSwitch)",
           "360")
      .opt({"--allreduce-us"}, "US", "latency of one all-reduce for the projection", "10")
      .opt({"--hbm-gbps"}, "GB/S", "memory bandwidth of the floors (default: a device-to-device copy, measured)")
      .opt({"--fp8-tflops"}, "T", "FP8 tensor-core rate of the floors (H100/H200 SXM dense peak)", "1979")
      .opt({"--bf16-tflops"}, "T", "BF16 tensor-core rate of the floors (H100/H200 SXM dense peak)", "989")
      .opt({"--speculative-config"}, "JSON",
           "also time a verification step of K + 1 rows per sequence and the draft's K passes, and project the "
           "speedup: vLLM's {\"method\": \"eagle3\" or \"ngram\", \"num_speculative_tokens\": K, \"model\": DRAFT "
           "(eagle3, optional: without it a draft of the published MiniMax-M3 EAGLE3 shape)}")
      .flag({"--dense"}, "select every block in sparse layers")
      .flag({"--ops"}, "also print each op's eager time and calls in the decode step and the prefill chunk (largest first)")
      .opt({"--layers"}, "A:B",
           "time layers A .. B-1 of the model's layout as a model of B-A layers (their MoE and sparse-attention kinds "
           "kept; dummy weights): a rank too large for one GPU timed in pieces, e.g. 0:30 and 30:60")
      .opt({"--top-k"}, "N",
           "decode rows sample with top-k N (1.." + std::to_string(ops::kMaxDeviceTopK) +
               ", the sample op's filtered draw; 0: a plain draw); MiniMax's generation_config has 40",
           "0")
      .opt({"--top-p"}, "P", "with --top-k: top-p P in (0, 1] (MiniMax's generation_config has 0.95)", "1")
      .flag({"--host-sampling"},
            "the projections count sampling on the host (logits rows to the host, draws there; the draft's argmax "
            "there too) instead of the sample op on the device")
      .opt({"--tune"}, "FIELD=VALUE,...", "change the CUDA kernels' tuning fields (as `bench kernels --tune`)")
      .flag({"--json"}, "print one JSON object");
  add_model_load_flags(a);
  add_parallel_flags(a);
  if (!a.parse()) return 0;
  const std::string dir = a.has("--model") ? a.get("--model") : std::string(SIEVE_SOURCE_DIR) + "/configs/minimax-m3";
  // -tp N: N ranks in lockstep, collectives measured; --tp-rank-of N: rank 0's shard alone.
  const long long group_tp = a.get_int("--tensor-parallel-size");
  if (group_tp > 1 && a.has("--tp-rank-of"))
    throw Error("--tp-rank-of and --tensor-parallel-size: give one (one rank's shard alone, or every rank)");
  const long long tp = group_tp > 1 ? group_tp : a.get_int("--tp-rank-of"), batch = a.get_int("--batch"), context = a.get_int("--context");
  const long long prefill = a.get_int("--prefill"), iters = a.get_int("--iters");
  if (tp < 1 || tp > 64) throw Error("--tp-rank-of must be in 1..64");
  if (batch < 1 || batch > 4096) throw Error("--batch must be in 1..4096");
  if (context < 1 || context > (1 << 24)) throw Error("--context must be in 1..16777216");
  if (prefill < 0 || prefill > (1 << 20)) throw Error("--prefill must be in 0..1048576");
  if (iters < 1) throw Error("--iters must be at least 1");
  const bool print = !a.get_flag("--json");
  if (auto tune = a.maybe("--tune")) {
#ifdef SIEVE_HAVE_CUDA
    apply_tune_flag(*tune);
#else
    throw Error("--tune: this build has no CUDA backend");
#endif
  }
  const bool host_sampling = a.get_flag("--host-sampling");
  const long long top_k = a.get_int("--top-k");
  const double top_p = a.get_double("--top-p");
  if (top_k < 0 || top_k > ops::kMaxDeviceTopK)
    throw Error("--top-k must be in 0.." + std::to_string(ops::kMaxDeviceTopK));
  if (!(top_p > 0 && top_p <= 1)) throw Error("--top-p must be in (0, 1]");
  if (top_p < 1 && top_k == 0) throw Error("--top-p needs --top-k (top-p alone samples on the host)");
  // The decode rows' sampling parameters, as a request carries them.
  engine::SamplingParams dec_params;
  dec_params.top_k = int(top_k);
  dec_params.top_p = top_p;
  // Checked before any weights load: a mistake in it is one line.
  const spec::SpeculativeConfig sc =
      a.has("--speculative-config") ? spec::parse_speculative_config(a.get("--speculative-config"), true)
                                    : spec::SpeculativeConfig{};
  const bool eagle3 = sc.method == spec::Method::Eagle3;
  if (eagle3 && group_tp > 1)
    throw Error("--speculative-config: the eagle3 draft does not run in a tensor-parallel group (-tp) yet; "
                "--tp-rank-of N times one rank's shard with the draft");

  model::LoadOptions lo = model_load_options(a);
  if (!a.has("--load-format")) lo.load_format = "dummy";
  // The benchmark's workload shares the index top-k over 4 sparse layers (spec §3.4, ATOM's recipe).
  // Those two keys lie under the user's --hf-overrides (which win where they name them), so a run
  // that cuts the layers (`{"num_hidden_layers": 30}`) times the same workload.
  const std::string user_ov = a.has("--hf-overrides") ? a.get("--hf-overrides") : "";
  int layer0 = 0, layer_end = 0;
  nlohmann::json layers_ov = nlohmann::json::object();
  if (a.has("--layers")) {
    if (user_ov.find("num_hidden_layers") != std::string::npos)
      throw Error("--layers and num_hidden_layers in --hf-overrides: give one");
    // A checkpoint's layer A + i would have to load as layer i: timing runs use dummy weights.
    if (lo.load_format != "dummy") throw Error("--layers needs --load-format dummy (checkpoint layers are not renumbered)");
    const ModelConfig full = load_model_config(dir, user_ov);
    layers_ov = layer_range_overrides(a.get("--layers"), full.raw, &layer0, &layer_end);
  }
  lo.hf_overrides = bench_step_overrides(user_ov, layers_ov);
  std::unique_ptr<engine::RankGroup> group;
  std::unique_ptr<model::Model> alone;
  if (group_tp > 1) {
    group = load_model_group(dir, a, lo);
    if (follow_node_zero(*group)) return 0;
  } else {
    lo.tp_size = int(tp);
    lo.tp_rank = 0;
    lo.expert_parallel = a.get_flag("--enable-expert-parallel");
    alone = model::Model::load(dir, lo);
  }
  model::Model* m = group ? &group->model() : alone.get();
  const ModelConfig& cfg = m->config();
  const Device dev = m->device();
  const model::RankLayout layout = model::RankLayout::make(cfg, int(tp), 0, a.get_flag("--enable-expert-parallel"));
  // The sublayer outputs' element size (the norms' reads of them in the floors).
  const double part_bytes = double(dtype_size(m->partials_dtype()));
  model::CacheOptions co = model::cache_options_from_flags(a.get("--kv-cache-dtype"), a.get("--index-cache-dtype"));
  co.dense = a.get_flag("--dense");
  const int bs = m->block_size();
  const int64_t per_seq = (context + bs - 1) / bs, pre_blocks = (prefill + bs - 1) / bs;
  // The verification step's first row sits where the decode step's row does (position context - 1),
  // its K drafts after it; the draft's own positions follow.
  const int K = sc.num_speculative_tokens;
  engine::SyntheticVerification ver;
  if (sc.enabled()) ver = engine::synthetic_verification(int(batch), context - 1, K, bs, layout.vocab, 2);
  const int64_t step_blocks = std::max<int64_t>(batch * per_seq, ver.blocks_needed);
  co.num_blocks = step_blocks + pre_blocks;
  // Device memory along the way (a shortfall names the stage that needs more).
  auto memory_note = [&](const char* stage) {
    if (!dev.is_cuda()) return;
    size_t free_b = 0, total_b = 0;
    model::device_memory(dev, &free_b, &total_b);
    SIEVE_LOG(Info, "memory on " << dev.str() << " " << stage << ": " << double(free_b) / double(1ull << 30)
                                 << " GiB free of " << double(total_b) / double(1ull << 30));
  };
  memory_note("after the weights");
  BenchDraft draft;
  if (eagle3) {
    draft = load_bench_draft(sc, *m, lo.load_format == "dummy", tp);
    memory_note("after the draft's weights");
  }
  if (dev.is_cuda()) {
    size_t free_b = 0, total_b = 0;
    model::device_memory(dev, &free_b, &total_b);
    const size_t per_block = m->cache_bytes_per_block(co.kv_dtype, co.index_dtype) +
                             (draft.draft ? draft.draft->cache_bytes_per_block(co.kv_dtype, bs) : 0);
    const double need = double(per_block) * double(co.num_blocks);
    if (need > double(free_b))
      throw Error("the caches of --batch " + std::to_string(batch) + " x --context " + std::to_string(context) +
                  " (+ --prefill " + std::to_string(prefill) + ") need " + std::to_string(need / double(1ull << 30)) +
                  " GiB; " + std::to_string(double(free_b) / double(1ull << 30)) + " GiB are free after the weights");
  }
  // The caches hold zeros: no step's time depends on the values it reads.
  // With a group its leader runs every step (graphs for decode, prefill eagerly); the per-op
  // breakdown needs a runner of its own over rank 0's model, which only a shard alone has.
  std::unique_ptr<engine::Runner> own, own_eager;
  if (!group) {
    own = std::make_unique<engine::Runner>(*m);
    own_eager = std::make_unique<engine::Runner>(*m, engine::RunnerOptions{.enforce_eager = true});
  }
  engine::Runner& graphed = group ? group->leader() : *own;
  engine::Runner& eager = group ? group->leader() : *own_eager;
  graphed.allocate_caches(co);
  // The EAGLE3 runner: the target's steps also write the aux hidden states, the draft runs after.
  std::unique_ptr<engine::Runner> spec_runner;
  if (draft.draft) {
    draft.draft->allocate_cache(co.kv_dtype, co.num_blocks, bs, context + 2 * K + 2);
    spec_runner = std::make_unique<engine::Runner>(*m, engine::RunnerOptions{.device_sampling = !host_sampling});
    spec_runner->set_draft(draft.draft.get());
  }
  memory_note("after the caches");

  Rates rates;
  rates.hbm_gbps = a.has("--hbm-gbps") ? a.get_double("--hbm-gbps") : measure_copy_gbps(dev);
  rates.fp8_tflops = a.get_double("--fp8-tflops");
  rates.bf16_tflops = a.get_double("--bf16-tflops");
  const std::string quant = model::effective_quantization(cfg, lo.quantization);
  const bool fp8 = !quant.empty();
  const bool fp8_experts = fp8 && model::experts_take_fp8();
  const double kvb = dtype_size(co.kv_dtype), ixb = dtype_size(co.index_dtype);

  // Token ids inside the rank's vocabulary rows (embedding.vocab of a split vocabulary).
  std::mt19937 rng(1);
  auto token = [&] { return int32_t(rng() % uint32_t(layout.vocab)); };

  // The decode step: batch sequences, each with context keys after the step.
  engine::StepInputs dec;
  dec.max_blocks_per_seq = int(per_seq);
  dec.query_start_loc = {0};
  for (long long s = 0; s < batch; ++s) {
    const int64_t pos = context - 1;
    dec.token_ids.push_back(token());
    dec.positions.push_back(int32_t(pos));
    dec.slot_mapping.push_back((s * per_seq + pos / bs) * bs + pos % bs);
    dec.query_start_loc.push_back(int32_t(s + 1));
    dec.seq_lens.push_back(int32_t(context));
    for (int64_t b = 0; b < per_seq; ++b) dec.block_tables.push_back(int32_t(s * per_seq + b));
    dec.logits_indices.push_back(int32_t(s));
  }
  StepShape dshape;
  dshape.tokens = batch;
  dshape.q_keys.assign(size_t(batch), context);
  dshape.seq_ctx.assign(size_t(batch), context);
  dshape.logit_rows = batch;

  Marks marks(dev, graphed.stream().cuda_stream);
  Marks eager_marks(dev, eager.stream().cuda_stream);
  engine::HostLogits logits;  // the engine's (page-locked on a GPU)
  const StepTimes dec_t = time_steps(graphed, dec, nullptr, iters, marks, logits);
  const engine::GraphStats gs = graphed.graph_stats();
  // Sampling of the step's rows on the host, as the engine draws them (one request per worker).
  engine::Workers workers(engine::Workers::default_threads());
  const int64_t V = cfg.vocab_size;
  const double d_sample = sampling_ms(workers, logits, V, batch, 1, dec_params);
  // The engine's way: a draw per row by the sample op on the device (filtered with --top-k), the
  // ids to the host.
  // n rows of draws by the sample op (filtered with --top-k), their uniforms spread over [0, 1).
  auto drawn_rows = [&](size_t n) {
    std::vector<ops::SampleRow> out(n);
    for (size_t i = 0; i < n; ++i) {
      ops::SampleRow& r = out[i];
      r = {1.0, (double(i) + 0.5) / double(n), int32_t(ops::SampleMode::Draw), 0};
      if (top_k > 0) {
        r.mode = int32_t(ops::SampleMode::Filtered);
        r.top_k = int32_t(top_k);
        r.top_p = top_p;
      }
    }
    return out;
  };
  const std::vector<ops::SampleRow> dec_rows = drawn_rows(size_t(batch));
  const StepTimes dec_dev = time_steps(graphed, dec, nullptr, iters, marks, logits, &dec_rows);
  memory_note("after the graphed decode steps");
  const bool by_ops = a.get_flag("--ops");
  std::map<std::string, OpTotal> dec_ops, pre_ops;
  const auto dec_fam = group ? std::map<std::string, double>{}
                             : per_family_ms(eager, dec, cfg, co.dense, eager_marks, by_ops ? &dec_ops : nullptr);
  memory_note("after the eager decode step");
  const auto dec_cost = step_costs(cfg, layout, dshape, fp8, fp8_experts, kvb, ixb, part_bytes);
  double dec_bytes = 0;
  for (const auto& [k, c] : dec_cost) dec_bytes += c.bytes;
  const double dec_step = dec_t.step_ms, dec_floor = dec_bytes / (rates.hbm_gbps * 1e9) * 1e3;
  const double d_logits = dec_t.logits_ms;
  // What the TPOT projection counts: the device op and its ids copy, or (--host-sampling) the
  // logits to the host and the host's draws.
  const double d_sampling = host_sampling ? d_logits + d_sample : dec_dev.logits_ms;

  json out;
  out["model"] = dir;
  out["device"] = device_name(dev);
  out["tp_rank_of"] = tp;
  if (layer_end > 0) out["layers"] = {layer0, layer_end};
  out["tensor_parallel_size"] = group ? tp : 1;
  out["expert_parallel"] = a.get_flag("--enable-expert-parallel");
  out["quantization"] = fp8 ? quant : "bf16";
  // MXFP8 scales regrouped to 128 x 128 blocks (--fp8-scale-blocks 128x128), else as loaded.
  const std::string blocks = model::regroups_to_blocks128(lo, quant) ? " in 128x128 scale blocks" : "";
  out["fp8_scale_blocks"] = blocks.empty() ? "auto" : "128x128";
  out["experts"] = fp8_experts ? "fp8" : "bf16";
  out["kv_cache_dtype"] = std::string(dtype_name(co.kv_dtype));
  out["index_cache_dtype"] = std::string(dtype_name(co.index_dtype));
  out["weights_gb"] = double(m->weight_bytes()) / 1e9;
  out["hbm_gbps"] = rates.hbm_gbps;
  out["fp8_tflops"] = rates.fp8_tflops;
  out["bf16_tflops"] = rates.bf16_tflops;
  if (print) {
    std::printf("sieve bench step: %s, %s %lld (%s weights%s, %s experts, %s KV / %s index caches) on %s\n",
                dir.c_str(), group ? "every rank of" : "one rank of", tp, fp8 ? quant.c_str() : "bf16", blocks.c_str(),
                fp8_experts ? "fp8" : "bf16",
                std::string(dtype_name(co.kv_dtype)).c_str(), std::string(dtype_name(co.index_dtype)).c_str(),
                device_name(dev).c_str());
    std::printf("weights %.2f GB on the device; floors at %.0f GB/s (%s), %.0f FP8 / %.0f BF16 TFLOP/s\n",
                double(m->weight_bytes()) / 1e9, rates.hbm_gbps,
                a.has("--hbm-gbps") ? "given" : dev.is_cuda() ? "a device copy, measured" : "a figure for the CPU, not measured",
                rates.fp8_tflops, rates.bf16_tflops);
    if (layer_end > 0)
      std::printf("layers %d .. %d of the model's layout (--layers %d:%d), timed as a model of %d layers\n", layer0,
                  layer_end - 1, layer0, layer_end, layer_end - layer0);
  }
  json d;
  d["batch"] = batch;
  d["context"] = context;
  d["families"] = table("decode step: " + std::to_string(batch) + " sequences at " + std::to_string(context) +
                            " tokens (per-op times from an eager run with events around every op)",
                        dec_fam, dec_cost, rates, fp8, fp8_experts, print);
  if (by_ops) d["ops"] = ops_table("decode step, each op (eager, events around every op):", dec_ops, print);
  d["step_ms"] = dec_step;
  d["bytes"] = dec_bytes;
  d["floor_ms"] = dec_floor;
  d["ratio"] = dec_floor > 0 ? dec_step / dec_floor : 0.0;
  d["logits_to_host_ms"] = d_logits;
  d["sampling_ms"] = d_sample;
  d["sampling_top_k"] = top_k;
  d["sampling_top_p"] = top_p;
  d["device_sampling_ms"] = dec_dev.logits_ms;
  d["device_sampling_op_ms"] = dec_dev.op_ms;
  d["graphs"] = {{"captured", gs.captured}, {"replayed", gs.replayed}, {"off", gs.off_reason}};
  // Sampling: the sample op over the rows on the device and the ids to the host (the engine's
  // way; its floor: the rows read once); then, for comparison, the rows to the host and one draw
  // per sequence on the engine's workers.
  const double logit_bytes = double(batch) * double(V) * 4;
  const double logit_floor = logit_bytes / (rates.hbm_gbps * 1e9) * 1e3;
  d["families"].push_back({{"family", "sampling"}, {"time_ms", dec_dev.logits_ms}, {"bytes", logit_bytes},
                           {"flops", 0.0}, {"floor_ms", logit_floor},
                           {"ratio", logit_floor > 0 ? dec_dev.op_ms / logit_floor : 0.0},
                           {"op_ms", dec_dev.op_ms}, {"where", "device"}});
  d["families"].push_back({{"family", "sampling (host)"}, {"time_ms", d_logits + d_sample}, {"bytes", logit_bytes},
                           {"flops", 0.0}, {"floor_ms", 0.0}, {"ratio", 0.0},
                           {"logits_to_host_ms", d_logits}, {"host_ms", d_sample}, {"where", "host"}});
  if (print) {
    char filters[64] = "";
    if (top_k > 0) std::snprintf(filters, sizeof filters, ", top-k %lld top-p %g", top_k, top_p);
    std::printf("  %-20s %10.3f %12.3f %12s %10.3f %8.2f   (the op on the device %.3f, ratio of it; ids to host%s)\n",
                "sampling", dec_dev.logits_ms, logit_bytes / 1e9, "", logit_floor,
                logit_floor > 0 ? dec_dev.op_ms / logit_floor : 0.0, dec_dev.op_ms, filters);
    std::printf("  %-20s %10.3f %12.3f %12s %10s %8s   (logits to host %.3f, draws on the host %.3f)\n",
                "sampling (host)", d_logits + d_sample, logit_bytes / 1e9, "", "-", "-", d_logits, d_sample);
    std::printf("  %-20s %10.3f %12.3f %12s %10.3f %8.2f   (%s, median of %lld)\n", "step", dec_step, dec_bytes / 1e9,
                "", dec_floor, dec_floor > 0 ? dec_step / dec_floor : 0.0,
                gs.replayed > 0 ? "CUDA graph replay" : "eager: no graphs on this device", iters);
  }

  // Projection: the step, its logits and sampling, and two all-reduces per layer of the step's
  // sublayer outputs (in the model's partials dtype: bf16 on CUDA, fp32 with --f32-partials or on
  // the CPU) at the given bus bandwidth: time = bytes * 2(N-1)/N / bus. (A step of `rows` tokens.)
  // One all-reduce's bytes: `rows` rows of sublayer outputs.
  auto allreduce_bytes = [&](double rows) { return rows * double(cfg.hidden_size) * part_bytes; };
  const char* part_name = m->partials_dtype() == DType::BF16 ? "bf16" : "fp32";
  auto allreduce_ms = [&](double rows) {
    const double bytes = allreduce_bytes(rows);
    return tp > 1 ? (bytes * 2.0 * double(tp - 1) / double(tp) / (a.get_double("--allreduce-gbps") * 1e9)) * 1e3 +
                        a.get_double("--allreduce-us") * 1e-3
                  : 0.0;
  };
  const double ar_bytes = allreduce_bytes(double(batch));
  const double ar_ms = allreduce_ms(double(batch));
  // (-tp N: the step measured includes them.)
  const double comm = group ? 0.0 : 2.0 * cfg.num_hidden_layers * ar_ms;
  const double tpot = dec_step + d_sampling + comm;
  const char* sampling_where = host_sampling ? "logits to the host, draws there" : "on the device, ids to the host";
  out["decode"] = d;
  out["projected_tpot_ms"] = tpot;
  out["projection"] = {{"ranks", tp},
                       {"allreduce_gbps", a.get_double("--allreduce-gbps")},
                       {"allreduce_us", a.get_double("--allreduce-us")},
                       {"allreduce_bytes", ar_bytes},
                       {"allreduce_dtype", part_name},
                       {"allreduces", 2 * cfg.num_hidden_layers},
                       {"comm_ms", comm}};
  if (print && group)
    std::printf("  TPOT for %lld ranks: %.3f ms = step %.3f (its all-reduces included) + sampling %.3f (%s)\n",
                tp, tpot, dec_step, d_sampling, sampling_where);
  else if (print && tp > 1)
    std::printf("  projected TPOT for %lld ranks: %.3f ms = step %.3f + sampling %.3f (%s) + %d all-reduces x "
                "%.4f ms (%.0f KB of %s sublayer outputs each at %.0f GB/s bus bandwidth + %.0f us)\n",
                tp, tpot, dec_step, d_sampling, sampling_where, 2 * cfg.num_hidden_layers, ar_ms, ar_bytes / 1e3, part_name,
                a.get_double("--allreduce-gbps"), a.get_double("--allreduce-us"));
  else if (print)
    std::printf("  TPOT on one device: %.3f ms = step %.3f + sampling %.3f (%s)\n", tpot, dec_step, d_sampling,
                sampling_where);

  if (sc.enabled()) {
    // The verification step on the runner serving would use (with EAGLE3 the target's step also
    // writes the aux hidden states, and the draft's K passes follow it: the first over the step's
    // rows with fc over those states, then K - 1 one-row passes, each with the draft's lm_head and
    // its rows' argmax on the host).
    const int rows = K + 1;
    engine::Runner& vr = spec_runner ? *spec_runner : graphed;
    const int64_t replays_before = vr.graph_stats().replayed;
    engine::HostLogits vlogits;
    Marks vmarks(dev, vr.stream().cuda_stream);  // (each runner has its own stream)
    // Verification by the sample op on the device: greedy rows (the target's argmax of every row),
    // or with --top-k the decode rows' filtered draw on every row (the engine keeps a draft token
    // when the row's draw is it); the draft's proposals with its argmax there too. For comparison
    // the rows to the host and the host's draws (fewer steps: they only measure the copy).
    const std::vector<ops::SampleRow> ver_rows =
        top_k > 0 ? drawn_rows(size_t(batch * rows))
                  : std::vector<ops::SampleRow>(size_t(batch * rows), ops::SampleRow{1.0, 0.0, int32_t(ops::SampleMode::Greedy), 0});
    const StepTimes vt = time_steps(vr, ver.verify, spec_runner ? &ver.draft : nullptr, iters, vmarks, vlogits,
                                    host_sampling ? nullptr : &ver_rows);
    const bool v_graphs = vr.graph_stats().replayed > replays_before && vr.graph_stats().off_reason.empty();
    const StepTimes vt_host =
        host_sampling ? vt : time_steps(vr, ver.verify, nullptr, std::max(3LL, iters / 4), vmarks, vlogits);
    const double v_sample = sampling_ms(workers, vlogits, V, batch, rows, dec_params);
    const double v_sampling = host_sampling ? vt.logits_ms + v_sample : vt.logits_ms;
    memory_note("after the verification steps");
    StepShape vshape;
    vshape.tokens = batch * rows;
    for (long long s = 0; s < batch; ++s)
      for (int i = 0; i < rows; ++i) vshape.q_keys.push_back(context + i);
    vshape.seq_ctx.assign(size_t(batch), context + K);
    vshape.logit_rows = batch * rows;
    const auto v_fam =
        group ? std::map<std::string, double>{} : per_family_ms(eager, ver.verify, cfg, co.dense, eager_marks);
    const auto v_cost = step_costs(cfg, layout, vshape, fp8, fp8_experts, kvb, ixb, part_bytes);
    double v_bytes = 0;
    for (const auto& [k, c] : v_cost) v_bytes += c.bytes;
    const double v_floor = v_bytes / (rates.hbm_gbps * 1e9) * 1e3;
    const double v_comm = group ? 0.0 : 2.0 * cfg.num_hidden_layers * allreduce_ms(double(batch * rows));
    // Whole steps: the forward, its logits to the host, the draws (every row, as when every draft
    // is kept), the projected all-reduces and the draft's proposal; against the plain step's TPOT.
    const double spec_step = vt.step_ms + v_sampling + v_comm + vt.propose_ms;

    if (print) {
      std::printf("\nspeculative decoding: %s, K = %d (%d rows per sequence)\n", spec::method_name(sc.method), K, rows);
      if (draft.draft) {
        const spec::Eagle3Config& c = draft.draft->config();
        std::printf("  draft: %s; %.2f GB bf16 (hidden %lld, %d heads / %d kv heads, MLP %lld, draft vocabulary %lld)%s\n",
                    draft.source.c_str(), draft.weight_bytes / 1e9, (long long)c.hidden_size, c.num_heads,
                    c.num_kv_heads, (long long)c.intermediate_size, (long long)c.draft_vocab_size,
                    tp > 1 ? "; unsharded on the rank (the engine does not split the draft)" : "");
      } else {
        std::printf("  draft: n-gram lookup on the host (not timed)\n");
      }
    }
    json sp;
    sp["method"] = spec::method_name(sc.method);
    sp["num_speculative_tokens"] = K;
    sp["rows_per_sequence"] = rows;
    json v;
    v["families"] = table("verification step: " + std::to_string(batch) + " sequences of " + std::to_string(rows) +
                              " rows from position " + std::to_string(context - 1) + " (eager per-op times)",
                          v_fam, v_cost, rates, fp8, fp8_experts, print);
    v["step_ms"] = vt.step_ms;
    v["bytes"] = v_bytes;
    v["floor_ms"] = v_floor;
    v["ratio"] = v_floor > 0 ? vt.step_ms / v_floor : 0.0;
    v["logits_to_host_ms"] = vt_host.logits_ms;
    v["sampling_ms"] = v_sample;
    v["device_sampling_ms"] = host_sampling ? 0.0 : vt.logits_ms;
    v["device_sampling_op_ms"] = vt.op_ms;
    v["counted_sampling_ms"] = v_sampling;
    v["comm_ms"] = v_comm;
    v["graph"] = v_graphs;
    sp["verify"] = v;
    if (print)
      std::printf("  %-20s %10.3f %12.3f %12s %10.3f %8.2f   (%s, median of %lld)\n", "step", vt.step_ms,
                  v_bytes / 1e9, "", v_floor, v_floor > 0 ? vt.step_ms / v_floor : 0.0,
                  v_graphs ? "CUDA graph replay" : "eager", iters);
    if (draft.draft) {
      const spec::Eagle3Config& c = draft.draft->config();
      sp["draft"] = {{"source", draft.source},
                     {"weights_gb", draft.weight_bytes / 1e9},
                     {"hidden_size", c.hidden_size},
                     {"intermediate_size", c.intermediate_size},
                     {"num_attention_heads", c.num_heads},
                     {"num_key_value_heads", c.num_kv_heads},
                     {"head_dim", c.head_dim},
                     {"draft_vocab_size", c.draft_vocab_size},
                     {"aux_layers", c.aux_layers},
                     {"unsharded", tp > 1},
                     {"passes_ms", vt.draft_ms},
                     {"propose_ms", vt.propose_ms}};
    } else {
      sp["draft"] = nullptr;  // n-gram lookup: host work, not timed
    }
    sp["plain_step_ms"] = dec_step;
    sp["verify_step_ms"] = vt.step_ms;
    sp["draft_ms"] = vt.draft_ms;
    sp["plain_tpot_ms"] = tpot;
    sp["spec_step_ms"] = spec_step;
    // The mean tokens a step must gain to break even.
    sp["break_even_length"] = dec_step > 0 ? (vt.step_ms + vt.draft_ms) / dec_step : 0.0;
    std::vector<double> lengths;
    for (double L : {1.5, 2.0, 2.5, 3.0, 3.2})
      if (L < rows) lengths.push_back(L);
    lengths.push_back(rows);
    json speedup = json::array();
    for (double L : lengths) {
      const double fwd = vt.step_ms + vt.draft_ms > 0 ? L * dec_step / (vt.step_ms + vt.draft_ms) : 0.0;
      const double whole = spec_step > 0 ? L * tpot / spec_step : 0.0;
      speedup.push_back({{"acceptance_length", L}, {"forwards", fwd}, {"steps", whole}});
    }
    sp["speedup"] = speedup;
    if (print) {
      std::printf("\n  %-22s %9.3f ms  (forward on the device)\n", "plain decode step", dec_step);
      if (host_sampling)
        std::printf("  %-22s %9.3f ms  (forward on the device; logits to host %.3f, draws %.3f, all-reduces %.3f)\n",
                    "verification step", vt.step_ms, vt.logits_ms, v_sample, v_comm);
      else
        std::printf("  %-22s %9.3f ms  (forward on the device; %s rows by the sample op + ids to host %.3f (op "
                    "%.3f), all-reduces %.3f; on the host instead: logits to host %.3f + draws %.3f)\n",
                    "verification step", vt.step_ms, top_k > 0 ? "filtered" : "greedy", vt.logits_ms, vt.op_ms, v_comm,
                    vt_host.logits_ms, v_sample);
      if (draft.draft)
        std::printf("  %-22s %9.3f ms  (%d passes on the device; propose %.3f ms with %s)\n", "draft passes",
                    vt.draft_ms, K, vt.propose_ms,
                    host_sampling ? "their logits to the host and the argmax there" : "the argmax on the device, ids to the host");
      std::printf("  %-22s %9.3f ms  vs plain TPOT %.3f ms; forwards break even at an acceptance length of %.2f\n",
                  "whole speculative step", spec_step, tpot, sp["break_even_length"].get<double>());
      std::printf("  %-22s %12s %12s\n", "mean acceptance length", "forwards", "whole steps");
      for (const auto& r : speedup)
        std::printf("  %22.2f %11.2fx %11.2fx\n", r["acceptance_length"].get<double>(), r["forwards"].get<double>(),
                    r["steps"].get<double>());
    }
    out["speculative"] = sp;
    // The prefill chunk gets the draft's memory back.
    spec_runner.reset();
    draft.draft.reset();
    draft.embed = Buffer();
  }

  if (prefill > 0) {
    engine::StepInputs pre;
    const int64_t base = step_blocks;
    for (int64_t i = 0; i < prefill; ++i) {
      pre.token_ids.push_back(token());
      pre.positions.push_back(int32_t(i));
      pre.slot_mapping.push_back((base + i / bs) * bs + i % bs);
    }
    for (int64_t b = 0; b < pre_blocks; ++b) pre.block_tables.push_back(int32_t(base + b));
    pre.max_blocks_per_seq = int(pre_blocks);
    pre.query_start_loc = {0, int32_t(prefill)};
    pre.seq_lens = {int32_t(prefill)};
    pre.logits_indices = {int32_t(prefill - 1)};
    StepShape ps;
    ps.tokens = prefill;
    for (int64_t i = 0; i < prefill; ++i) ps.q_keys.push_back(i + 1);
    ps.seq_ctx = {prefill};
    ps.logit_rows = 1;
    std::vector<double> pre_ms;
    const long long pre_iters = std::max<long long>(2, iters / 5);
    for (long long i = 0; i < pre_iters + 1; ++i) {
      eager_marks.clear();
      int up = -1, comp = -1;
      eager.set_phase_observer([&](engine::Runner::Phase p) {
        if (p == engine::Runner::Phase::Uploaded) up = eager_marks.mark();
        if (p == engine::Runner::Phase::Computed) comp = eager_marks.mark();
      });
      eager.run(pre, logits);
      eager.set_phase_observer({});
      if (i > 0) pre_ms.push_back(eager_marks.ms(up, comp));
    }
    const auto pre_fam = group ? std::map<std::string, double>{}
                               : per_family_ms(eager, pre, cfg, co.dense, eager_marks, by_ops ? &pre_ops : nullptr);
    const auto pre_cost = step_costs(cfg, layout, ps, fp8, fp8_experts, kvb, ixb, part_bytes);
    json p;
    p["tokens"] = prefill;
    p["families"] = table("prefill chunk: " + std::to_string(prefill) + " tokens of one sequence from position 0", pre_fam,
                          pre_cost, rates, fp8, fp8_experts, print);
    if (by_ops) p["ops"] = ops_table("prefill chunk, each op (eager, events around every op):", pre_ops, print);
    double fl = 0;
    for (const auto& [k, c] : pre_cost) fl += floor_ms(c, k == "GEMMs" ? fp8 : k == "MoE" ? fp8_experts : false, rates);
    p["step_ms"] = median(pre_ms);
    p["floor_ms"] = fl;
    p["tokens_per_s"] = double(prefill) / (median(pre_ms) * 1e-3);
    // The chunk's all-reduces carry `prefill` rows each: at 8192 tokens 256 x a decode step's.
    const double pre_ar_ms = allreduce_ms(double(prefill));
    const double pre_comm = group ? 0.0 : 2.0 * cfg.num_hidden_layers * pre_ar_ms;
    p["projected_ms"] = median(pre_ms) + pre_comm;
    p["comm_ms"] = pre_comm;
    p["allreduce_bytes"] = allreduce_bytes(double(prefill));
    p["allreduce_dtype"] = part_name;
    if (print)
      std::printf("  %-20s %10.3f %12s %12s %10.3f %8.2f   (eager, median of %lld; %.0f tokens/s)\n", "step",
                  median(pre_ms), "", "", fl, fl > 0 ? median(pre_ms) / fl : 0.0, pre_iters, double(prefill) / (median(pre_ms) * 1e-3));
    if (print && !group && tp > 1)
      std::printf("  projected chunk for %lld ranks: %.3f ms = step %.3f + %d all-reduces x %.4f ms (%.1f MB of %s "
                  "sublayer outputs each) (%.0f tokens/s)\n",
                  tp, median(pre_ms) + pre_comm, median(pre_ms), 2 * cfg.num_hidden_layers, pre_ar_ms,
                  allreduce_bytes(double(prefill)) / 1e6, part_name,
                  double(prefill) / ((median(pre_ms) + pre_comm) * 1e-3));
    out["prefill"] = p;
  }
  if (!print) std::printf("%s\n", out.dump(2).c_str());
  return 0;
}

Register reg{"bench step", "one engine step at real shapes as one tensor-parallel rank runs it, per op family against its floor",
             &run_bench_step};

}  // namespace
}  // namespace sieve::cli
