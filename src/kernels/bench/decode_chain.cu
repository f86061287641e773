// One decode layer's small-kernel chain (decode_chain.h) over device buffers of random contents.
#include "kernels/bench/decode_chain.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "kernels/bench/bench.h"
#include "kernels/bench/harness.cuh"
#include "kernels/cuda/tuning.h"
#include "kernels/memory.h"
#include "kernels/ops.h"

namespace sieve::kernels_bench {

namespace {
constexpr int kHeadDim = 128, kRotary = 64, kBlock = 128;
constexpr int64_t kMaxPosition = 4096;
constexpr uint8_t kCachePoison = 0xff;

// An FP8 weight [rows, cols] with 1 x 128 block scales (MXFP8 checkpoints' layout on CUDA), its
// values ~ 1 / sqrt(cols) so that a GEMM of unit rows gives values of order one.
struct Fp8Weight {
  DevPtr data, scale;
  int64_t rows = 0, cols = 0;
  Fp8Weight(int64_t r, int64_t c, uint64_t seed) : rows(r), cols(c) {
    const int64_t g = ops::fp8_groups(c);
    data = dev(size_t(r * c));
    scale = dev(size_t(r * g) * 4);
    fill(data->p, 1, size_t(r * c), seed);
    const float s = float(1.0 / std::sqrt(double(c))) / 448.0f;
    fill(scale->p, 2, size_t(r * g), seed + 1, s, 0.5f * s);
  }
  ops::WeightView view() const {
    ops::WeightView w;
    w.data = data->p;
    w.dtype = DType::FP8_E4M3;
    w.rows = rows, w.cols = cols;
    w.scale = scale->as<float>();
    w.scale_block_rows = 1, w.scale_block_cols = 128;
    return w;
  }
  double bytes() const { return double(rows * cols) + double(rows * ops::fp8_groups(cols)) * 4; }
};
}  // namespace

std::string ChainShape::name() const {
  return "b" + std::to_string(rows) + " h" + std::to_string(hidden) + " q" + std::to_string(q_heads) + " shared" +
         std::to_string(shared_inter) + " e" + std::to_string(experts) + "k" + std::to_string(topk) +
         (f32_partials ? " f32 partials" : " bf16 partials");
}

struct DecodeChain::Impl {
  ChainShape s;
  int device = 0;
  int64_t W = 0, qc = 0;  // qkv columns [q | k | v | index q | index k], q columns
  DType part_t = DType::BF16;  // the sublayer outputs' (part)
  DevPtr ids, table, h, part, xq, xs, in_norm, post_norm, qkv, head_norms, cos_sin, positions, slots;
  DevPtr kv_k, kv_v, kv_ks, kv_vs, index_k, attn, xf, x8, x8s, gate, bias, route_ids, route_w, gu, aq, as;
  std::unique_ptr<Fp8Weight> wqkv, wo, wgu, wdn;

  // The buffers the chain writes, with their sizes; `cache`: it writes only the step's slots.
  struct Out {
    const DevMem* mem;
    size_t bytes;
    bool cache;
  };
  std::vector<Out> written() const {
    const int64_t T = s.rows, H = s.hidden, I = s.shared_inter;
    const size_t cache = size_t(T) * kBlock * kHeadDim;
    return {{h.get(), size_t(T * H) * 4, false},
            {part.get(), size_t(T * H) * dtype_size(part_t), false},
            {xq.get(), size_t(T * H), false},
            {xs.get(), size_t(T * ops::fp8_groups(H)) * 4, false},
            {qkv.get(), size_t(T * W) * 2, false},
            {kv_k.get(), cache, true},
            {kv_v.get(), cache, true},
            {kv_ks.get(), size_t(T) * kBlock * 4, true},
            {kv_vs.get(), size_t(T) * kBlock * 4, true},
            {index_k.get(), cache, true},
            {xf.get(), size_t(T * H) * 4, false},
            {x8.get(), size_t(T * H), false},
            {x8s.get(), size_t(T * ops::fp8_groups(H)) * 4, false},
            {route_ids.get(), size_t(T) * s.topk * 4, false},
            {route_w.get(), size_t(T) * s.topk * 4, false},
            {gu.get(), size_t(T * 2 * I) * 2, false},
            {aq.get(), size_t(T * I), false},
            {as.get(), size_t(T * ops::fp8_groups(I)) * 4, false}};
  }
};

std::vector<std::string> DecodeChain::output_names() {
  return {"h",  "part",    "xq",      "xq scales", "qkv", "k cache", "v cache", "k scales", "v scales", "index cache",
          "xf", "xf fp8", "xf scales", "expert ids", "expert weights", "gate_up", "act", "act scales"};
}

DecodeChain::DecodeChain(const ChainShape& shape, uint64_t seed) : d_(std::make_unique<Impl>()) {
  Impl& d = *d_;
  d.s = shape;
  d.part_t = shape.f32_partials ? DType::F32 : DType::BF16;
  cuda_check(cudaGetDevice(&d.device), "cudaGetDevice");
  const int64_t T = shape.rows, H = shape.hidden, I = shape.shared_inter, E = shape.experts;
  d.qc = int64_t(shape.q_heads) * kHeadDim;
  d.W = d.qc + 4 * kHeadDim;
  std::vector<int32_t> ids(static_cast<size_t>(T)), pos(static_cast<size_t>(T));
  std::vector<int64_t> slots(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    ids[size_t(t)] = int32_t((seed * 7919 + uint64_t(t) * 104729) % uint64_t(shape.vocab));
    pos[size_t(t)] = int32_t((100 + 37 * t + int64_t(seed)) % kMaxPosition);
    // Token t's key goes to block t (each token its own block, at its position's offset).
    slots[size_t(t)] = t * kBlock + pos[size_t(t)] % kBlock;
  }
  d.ids = upload(ids);
  d.positions = upload(pos);
  d.slots = upload(slots);
  std::vector<float> cs(size_t(kMaxPosition) * kRotary);
  ops::build_rope_table(cs.data(), kMaxPosition, kRotary, 5e6);
  d.cos_sin = upload(cs);

  auto f32 = [](int64_t n, uint64_t sd, float lo, float a) {
    DevPtr p = dev(size_t(n) * 4);
    fill(p->p, 2, size_t(n), sd, a, lo);
    return p;
  };
  d.table = dev(size_t(shape.vocab * H) * 2);
  fill(d.table->p, 0, size_t(shape.vocab * H), seed + 1);
  d.in_norm = f32(H, seed + 2, -0.5f, 1.0f);
  d.post_norm = f32(H, seed + 3, -0.5f, 1.0f);
  d.head_norms = f32(4 * kHeadDim, seed + 4, -0.5f, 1.0f);  // q, k, index q, index k
  d.gate = f32(E * H, seed + 5, -0.02f, 0.04f);
  d.bias = f32(E, seed + 6, -0.01f, 0.02f);
  d.attn = dev(size_t(T * d.qc) * 2);
  fill(d.attn->p, 0, size_t(T * d.qc), seed + 7);
  d.wqkv = std::make_unique<Fp8Weight>(d.W, H, seed + 10);
  d.wo = std::make_unique<Fp8Weight>(H, d.qc, seed + 20);
  d.wgu = std::make_unique<Fp8Weight>(2 * I, H, seed + 30);
  d.wdn = std::make_unique<Fp8Weight>(H, I, seed + 40);

  const size_t cache = size_t(T) * kBlock * kHeadDim;
  d.h = dev(size_t(T * H) * 4), d.part = dev(size_t(T * H) * dtype_size(d.part_t)), d.xf = dev(size_t(T * H) * 4);
  d.xq = dev(size_t(T * H)), d.xs = dev(size_t(T * ops::fp8_groups(H)) * 4);
  d.x8 = dev(size_t(T * H)), d.x8s = dev(size_t(T * ops::fp8_groups(H)) * 4);
  d.qkv = dev(size_t(T * d.W) * 2);
  d.kv_k = dev(cache), d.kv_v = dev(cache), d.index_k = dev(cache);
  d.kv_ks = dev(size_t(T) * kBlock * 4), d.kv_vs = dev(size_t(T) * kBlock * 4);
  d.route_ids = dev(size_t(T) * shape.topk * 4), d.route_w = dev(size_t(T) * shape.topk * 4);
  d.gu = dev(size_t(T * 2 * I) * 2);
  d.aq = dev(size_t(T * I)), d.as = dev(size_t(T * ops::fp8_groups(I)) * 4);
  for (const auto& o : d.written()) cuda_check(cudaMemset(o.mem->p, 0, o.mem->bytes), "chain buffers");
  cuda_check(cudaDeviceSynchronize(), "chain inputs");
}

DecodeChain::~DecodeChain() = default;

std::vector<std::string> DecodeChain::op_names() {
  return {"embedding", "input norm", "qkv GEMM", "q/k norm + RoPE + cache write", "o_proj (quantizer + GEMM)",
          "post-attention add + norm", "routing", "shared gate_up GEMM", "SwiGLU-OAI", "shared down GEMM",
          "next input norm"};
}

void DecodeChain::run(cudaStream_t stream, bool sync, const SideStream* side, int ops) const {
  SIEVE_CHECK(ops < 0 || !side, "decode chain: a prefix of the chain runs on one stream");
  int left = ops < 0 ? int(op_names().size()) : ops;
  const Impl& d = *d_;
  const ChainShape& s = d.s;
  const int64_t T = s.rows, H = s.hidden, I = s.shared_inter;
  const ops::Stream main{Device{DeviceKind::CUDA, d.device}, stream};
  ops::Stream st = main;  // where the next op goes
  auto step = [&] {
    if (sync)
      cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(st.cuda_stream)), "decode chain (synchronised)");
  };
  // fp8: y FP8 (xq); else y F32 (xf) and, with dual, its FP8 copy (x8) too. add: h += part
  // first, part in its own dtype added to the fp32 h (as the model's add_norm).
  auto norm = [&](const DevMem& weight, bool add, bool fp8, bool dual = false) {
    ops::RmsNormParams p;
    p.x = add ? d.part->p : d.h->p;
    p.x_dtype = add ? d.part_t : DType::F32;
    if (add) p.residual = d.h->p, p.ldr = H, p.residual_f32 = true;
    p.y = fp8 ? d.xq->p : d.xf->p;
    p.y_dtype = fp8 ? DType::FP8_E4M3 : DType::F32;
    p.y_scale = fp8 ? d.xs->as<float>() : nullptr;
    if (dual) p.y_fp8 = d.x8->p, p.ld_fp8 = H, p.y_fp8_scale = d.x8s->as<float>();
    p.weight = weight.p;
    p.weight_dtype = DType::F32;
    p.rows = T, p.dim = H, p.ldx = H, p.ldy = H;
    p.eps = 1e-6f;
    p.gemma = true;
    ops::rms_norm(p, st);
    step();
  };
  auto linear = [&](const void* x, DType xt, const float* xscale, int64_t ldx, const Fp8Weight& w, void* y, DType yt) {
    ops::LinearParams p;
    p.x = x, p.x_dtype = xt, p.ldx = ldx, p.x_scale = xscale;
    p.w = w.view();
    p.y = y, p.y_dtype = yt, p.ldy = w.rows;
    p.m = T;
    ops::linear(p, st);
    step();
  };

  ops::EmbeddingParams ep;
  ep.ids = d.ids->as<int32_t>();
  ep.num_tokens = T;
  ep.table = d.table->p;
  ep.table_dtype = DType::BF16;
  ep.vocab = s.vocab, ep.hidden = H;
  ep.out = d.h->p;
  ep.out_dtype = DType::F32;
  if (left-- <= 0) return;
  ops::embedding(ep, st);
  step();
  if (left-- <= 0) return;
  norm(*d.in_norm, false, true);
  if (left-- <= 0) return;
  linear(d.xq->p, DType::FP8_E4M3, d.xs->as<float>(), H, *d.wqkv, d.qkv->p, DType::BF16);

  ops::QkvNormRopeCacheParams rp;
  rp.qkv = d.qkv->p;
  rp.act_dtype = DType::BF16;
  rp.num_tokens = T, rp.row_stride = d.W;
  rp.num_q_heads = s.q_heads, rp.num_kv_heads = 1, rp.head_dim = kHeadDim;
  rp.q_offset = 0, rp.k_offset = d.qc, rp.v_offset = d.qc + kHeadDim;
  rp.num_index_heads = 1, rp.index_dim = kHeadDim;
  rp.index_q_offset = d.qc + 2 * kHeadDim, rp.index_k_offset = d.qc + 3 * kHeadDim;
  const float* hn = d.head_norms->as<float>();
  rp.q_norm = hn, rp.k_norm = hn + kHeadDim, rp.index_q_norm = hn + 2 * kHeadDim, rp.index_k_norm = hn + 3 * kHeadDim;
  rp.norm_dtype = DType::F32;
  rp.positions = d.positions->as<int32_t>();
  rp.cos_sin = d.cos_sin->as<float>();
  rp.rotary_dim = kRotary;
  rp.slot_mapping = d.slots->as<int64_t>();
  rp.kv.k = d.kv_k->p, rp.kv.v = d.kv_v->p;
  rp.kv.k_scale = d.kv_ks->as<float>(), rp.kv.v_scale = d.kv_vs->as<float>();
  rp.kv.dtype = DType::FP8_E4M3;
  rp.kv.num_blocks = T, rp.kv.block_size = kBlock, rp.kv.num_kv_heads = 1, rp.kv.head_dim = kHeadDim;
  rp.index_cache.k = d.index_k->p;
  rp.index_cache.dtype = DType::FP8_E4M3;
  rp.index_cache.num_blocks = T, rp.index_cache.block_size = kBlock, rp.index_cache.index_dim = kHeadDim;
  if (left-- <= 0) return;
  ops::qkv_norm_rope_cache(rp, st);
  step();

  // o_proj over the (fixed) attention output: its quantizer, then the GEMM.
  if (left-- <= 0) return;
  linear(d.attn->p, DType::BF16, nullptr, d.qc, *d.wo, d.part->p, d.part_t);
  // The post-attention add + norm: fp32 rows for the router, FP8 ones for the experts.
  if (left-- <= 0) return;
  norm(*d.post_norm, true, false, true);

  ops::MoeRouteParams mr;
  mr.x = d.xf->p, mr.x_dtype = DType::F32, mr.hidden = H, mr.ldx = H;
  mr.gate = d.gate->as<float>(), mr.bias = d.bias->as<float>();
  mr.num_tokens = T, mr.num_experts = s.experts, mr.topk = s.topk;
  mr.renormalize = true, mr.scaling = 2.0f;
  mr.ids = d.route_ids->as<int32_t>(), mr.weights = d.route_w->as<float>();
  const bool beside = side && *side;
  if (beside) side->fork(stream);
  if (left-- <= 0) return;
  ops::moe_route(mr, st);
  step();

  // The shared expert: gate_up over the FP8 normed rows, SwiGLU-OAI into FP8, down into part;
  // beside the routing on the side stream when there is one.
  if (beside) st.cuda_stream = side->stream();
  if (left-- <= 0) return;
  linear(d.x8->p, DType::FP8_E4M3, d.x8s->as<float>(), H, *d.wgu, d.gu->p, DType::BF16);
  ops::SwigluOaiParams sp;
  sp.gate_up = d.gu->p;
  sp.out = d.aq->p, sp.out_scale = d.as->as<float>();
  sp.dtype = DType::BF16;
  sp.rows = T, sp.inter = I, sp.ld_in = 2 * I, sp.ld_out = I;
  sp.alpha = 1.702f, sp.limit = 7.0f, sp.beta = 1.0f;
  if (left-- <= 0) return;
  ops::swiglu_oai(sp, st);
  step();
  if (left-- <= 0) return;
  linear(d.aq->p, DType::FP8_E4M3, d.as->as<float>(), I, *d.wdn, d.part->p, d.part_t);
  if (beside) {
    st = main;
    side->join(stream);
  }

  // The next layer's input norm.
  if (left-- <= 0) return;
  norm(*d.in_norm, true, true);
}

std::vector<std::vector<uint8_t>> DecodeChain::outputs() const {
  cuda_check(cudaDeviceSynchronize(), "decode chain outputs");
  std::vector<std::vector<uint8_t>> out;
  for (const auto& o : d_->written()) {
    out.emplace_back(o.bytes);
    cuda_check(cudaMemcpy(out.back().data(), o.mem->p, o.bytes, cudaMemcpyDeviceToHost), "decode chain outputs");
  }
  return out;
}

void DecodeChain::poison(cudaStream_t stream, uint8_t byte) const {
  // The caches' other slots keep what they hold, so they get the same poison every time.
  for (const auto& o : d_->written())
    cuda_check(cudaMemsetAsync(o.mem->p, o.cache ? kCachePoison : byte, o.bytes, stream), "decode chain poison");
}

bool DecodeChain::is_cache(size_t output) const { return d_->written().at(output).cache; }

double DecodeChain::bytes() const {
  const Impl& d = *d_;
  const double T = double(d.s.rows), H = double(d.s.hidden), I = double(d.s.shared_inter);
  const double weights = d.wqkv->bytes() + d.wo->bytes() + d.wgu->bytes() + d.wdn->bytes() +
                         double(d.s.experts) * H * 4 + 3 * H * 4 + 4 * kHeadDim * 4;
  // Per op, the activation bytes in and out (scales left out), P the size of a part element (2,
  // or 4 with f32_partials): embedding 2 + 4 an element of h; input norm 4 + 1; qkv GEMM 1 in;
  // o_proj's quantizer 2 + 1 and GEMM 1 in (an element of its input), P out; the post-attention
  // add + norm P + 4 + 8 + 1 (part and h in, h and the fp32 rows out, their FP8 copy); the router
  // GEMM 4; the shared expert's GEMM 1, down P out; the next input norm P + 4 + 4 + 1. qkv rows
  // out of the GEMM, in and (q and index q) back out of the cache write, and the three cached
  // vectors; gate_up out and in, the FP8 activation out and in.
  const double qc = double(d.qc), P = double(dtype_size(d.part_t));
  const double acts = T * H * (6 + 5 + 1 + 13 + 4 + 1 + 9 + 4 * P) + T * qc * 4 + T * double(d.W) * 2 * 2 +
                      T * (qc + kHeadDim) * 2 + T * 3 * kHeadDim + T * 2 * I * 2 * 2 + T * I * 2;
  return weights + acts;
}

void run_chain_rows(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row) {
  constexpr const char* kKernel = "decode chain (one MoE layer's small kernels and GEMMs)";
  if (!opt.rows.empty() && std::string(kKernel).find(opt.rows) == std::string::npos) return;
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  // One TP8 rank of MiniMax-M3 at decode batch 32 (docs/performance.md "One TP8 rank"), with
  // bf16 sublayer outputs as the model writes them, then with fp32 ones (--f32-partials).
  for (const bool f32_partials : {false, true}) {
    ChainShape shape;
    shape.f32_partials = f32_partials;
    const std::string name = shape.name();
    if (!opt.filter.empty() && ("decode chain " + name + " fp8").find(opt.filter) == std::string::npos) continue;
    // Chains with weights of their own, enough that their weights exceed 4 x the L2 (a decode step
    // reads each layer's weights from DRAM).
    std::vector<std::unique_ptr<DecodeChain>> chains;
    chains.push_back(std::make_unique<DecodeChain>(shape, 1));
    const double bytes = chains[0]->bytes();
    const int sets = std::clamp(int(std::ceil(4.0 * env.l2_mb * 1048576.0 / bytes)), 2, 16);
    for (int i = 1; i < sets; ++i) chains.push_back(std::make_unique<DecodeChain>(shape, uint64_t(1 + 100 * i)));
    const int iters = std::max(50, opt.iters);
    // The shared expert beside the routing, as the model runs it (LoadOptions::side_stream).
    int device = 0;
    cuda_check(cudaGetDevice(&device), "cudaGetDevice");
    const SideStream side(Device{DeviceKind::CUDA, device});
    const SideStream* use_side = nullptr;
    int prefix = -1;
    auto fn = [&](int set, cudaStream_t stream) { chains[size_t(set)]->run(stream, false, use_side, prefix); };
    struct Variant {
      std::string mode;
      int chain_pdl;  // -2: as tuned
      bool linear_pdl;
      int pdl_mask;
      bool side = false;
    };
    const std::vector<Variant> variants = {
        {"PDL as tuned (default: every kernel)", -2, true, -1},
        {"PDL as tuned, the shared expert on a side stream beside the routing", -2, true, -1, true},
        {"GEMMs' PDL only (launch.chain_pdl 0)", 0, true, -1},
        {"no PDL (chain_pdl 0, linear.pdl false, pdl_mask 0)", 0, false, 0}};
    for (const bool batched : {true, false}) {
      for (const Variant& v : variants) {
        cuda::Tuning t = cuda::tuning();
        if (v.chain_pdl != -2) {
          t.launch.chain_pdl = v.chain_pdl;
          t.linear.pdl = v.linear_pdl;
          t.launch.pdl_mask = v.pdl_mask;
        }
        cuda::TuningScope scope(t);
        use_side = v.side ? &side : nullptr;
        Row r{kKernel, name, "fp8", (batched ? kBatchMode : std::string("graph (one call)")) + ", " + v.mode, 0,
              bytes / (env.copy_gbps * 1e9) * 1e6, "bytes"};
        r.runs = iters, r.input_sets = sets;
        r.us = time_it(iters, sets, fn, true, st, batched ? kGraphBatch : 1);
        on_row(r);
      }
    }
    // The chain's prefixes (one stream, PDL as tuned, graphs of 16): each row's time less the
    // previous row's is what that op adds where it runs in the chain. The floor column is the
    // whole chain's.
    use_side = nullptr;
    const std::vector<std::string> names = DecodeChain::op_names();
    for (prefix = 1; prefix <= int(names.size()); ++prefix) {
      Row r{kKernel, name, "fp8", std::string(kBatchMode) + ", the first " + std::to_string(prefix) + " ops (to " +
                                      names[size_t(prefix - 1)] + ")", 0,
            bytes / (env.copy_gbps * 1e9) * 1e6, "bytes"};
      r.runs = iters, r.input_sets = sets;
      r.us = time_it(iters, sets, fn, true, st, kGraphBatch);
      on_row(r);
    }
    prefix = -1;
  }
  cuda_check(cudaStreamSynchronize(st), "bench end");
  cudaStreamDestroy(st);
}

}  // namespace sieve::kernels_bench
