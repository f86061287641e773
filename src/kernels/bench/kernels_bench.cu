// Kernel benchmark (see bench.h): the cases and their rows. Each case builds several input sets
// on the device (caches, shuffled block tables, queries; harness.cuh), enough that what its
// lightest row reads in one call, over all sets, exceeds 4x the L2, rotates through them, and
// times every launch with CUDA events (median of opt.iters after warm-up), eagerly and replayed
// from a CUDA graph.
#include <cuda_runtime.h>
#ifdef SIEVE_HAVE_CUBLAS
#include <cublas_v2.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <cstdio>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/bench/bench.h"
#include "kernels/bench/bench_moe_fp8.h"
#include "kernels/bench/harness.cuh"
#include "kernels/bench/selections.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"

namespace sieve::kernels_bench {


namespace {

__global__ void empty_kernel() {}

// The tuning in force with `edit` applied, for the scope's lifetime (rows that time a variant).
struct TuningEdit {
  cuda::TuningScope scope;
  explicit TuningEdit(const std::function<void(cuda::Tuning&)>& edit) : scope(edited(edit)) {}
  static cuda::Tuning edited(const std::function<void(cuda::Tuning&)>& edit) {
    cuda::Tuning t = cuda::tuning();
    edit(t);
    return t;
  }
};

bool wanted(const Options& o, const std::string& what) {
  return o.filter.empty() || what.find(o.filter) != std::string::npos;
}
// --rows: a row (by its kernel name) is timed only when wanted.
bool row_wanted(const Options& o, const std::string& kernel) {
  return o.rows.empty() || kernel.find(o.rows) != std::string::npos;
}

// Kernel names of the rows whose --rows test comes before the row itself is built.
constexpr const char* kDecodeIndexer = "decode indexer";
constexpr const char* kFullDecodeStep = "decode step (cache write + indexer + sparse attention)";
constexpr const char* kDenseDecodeStep = "decode step (cache write + dense attention)";
// The read probe rows (read_probe_kernel): the bytes of each decode kernel, read and nothing else.
constexpr const char* kProbeIndexer = "read probe (decode indexer's bytes)";
constexpr const char* kProbeSparse = "read probe (sparse attention's bytes)";
constexpr const char* kProbeDense = "read probe (dense attention's bytes)";
constexpr const char* kCacheWrite = "qkv norm+rope+cache write";
constexpr const char* kMoe = "moe experts";

}  // namespace

Env measure_env() {
  Env e;
  int dev = 0;
  cuda_check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  e.gpu = prop.name;
  e.sms = prop.multiProcessorCount;
  e.l2_mb = prop.l2CacheSize / 1048576.0;
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  {
    const size_t n = size_t(2) << 30;  // 2 GiB copied: far past the L2
    DevMem a(n), b(n);
    fill(a.p, 2, n / 4, 1, 1.f, 0.f);
    const double us = time_it(20, 1, [&](int, cudaStream_t s) { cudaMemcpyAsync(b.p, a.p, n, cudaMemcpyDeviceToDevice, s); }, false, st);
    e.copy_gbps = 2.0 * double(n) / (us * 1e-6) / 1e9;
  }
#ifdef SIEVE_HAVE_CUBLAS
  {
    const int N = 8192;
    DevMem A(size_t(N) * N * 2), B(size_t(N) * N * 2), C(size_t(N) * N * 2);
    fill(A.p, 0, size_t(N) * N, 11);
    fill(B.p, 0, size_t(N) * N, 12);
    cublasHandle_t h;
    if (cublasCreate(&h) == CUBLAS_STATUS_SUCCESS) {
      cublasSetStream(h, st);
      const float alpha = 1.f, beta = 0.f;
      const double us = time_it(20, 1, [&](int, cudaStream_t) {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, N, N, &alpha, A.p, CUDA_R_16BF, N, B.p, CUDA_R_16BF, N,
                     &beta, C.p, CUDA_R_16BF, N, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      }, false, st);
      e.bf16_tflops = 2.0 * N * double(N) * N / (us * 1e-6) / 1e12;
      e.matrix_source = "cublas 8192^3 bf16, random data";
      cublasDestroy(h);
    }
  }
#endif
  if (e.bf16_tflops <= 0) {
    e.bf16_tflops = 790;
    e.matrix_source = "assumed (no cuBLAS in this build)";
  }
  cudaStreamDestroy(st);
  return e;
}

void run_all(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row) {
  cudaStream_t st;
  cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  const double l2 = env.l2_mb * 1048576.0;
  const double bw = env.copy_gbps * 1e9;
  const double rate = env.bf16_tflops * 1e12;
  const int iters = std::max(50, opt.iters);
  auto emit = [&](Row r, const Case& c) {
    r.runs = iters;
    r.input_sets = int(c.sets.size());
    on_row(r);
  };

  // ---- Calibration: what the timing method reads for a kernel that does nothing.
  if (row_wanted(opt, kEmptyKernel)) {
    Row r{kEmptyKernel, "1 CTA", "-", "eager", 0, 0, "-"};
    auto fn = [](int, cudaStream_t s) { empty_kernel<<<1, 32, 0, s>>>(); };
    r.us = time_it(iters, 1, fn, false, st);
    r.runs = iters, r.input_sets = 1;
    on_row(r);
    r.mode = "graph";
    r.us = time_it(iters, 1, fn, true, st);
    on_row(r);
    r.mode = kBatchMode;
    r.us = time_it(iters, 1, fn, true, st, kGraphBatch);
    on_row(r);
  }

  // ---- Decode.
  struct DShape {
    int batch, ctx;
  };
  // The long contexts (issue 50): b1 and b8 at 131072 and 524288 (4096 blocks a request; the b8
  // bf16 case holds 16 sets of 3 GB of caches).
  const std::vector<DShape> dshapes = {{1, 9216},    {32, 9216},   {128, 9216},  {32, 32768},
                                       {8, 131072},  {1, 131072},  {1, 524288},  {8, 524288}};
  for (bool fp8 : {true, false}) {
    const std::string dt = fp8 ? "fp8" : "bf16";
    for (const auto& ds : dshapes) {
      Case c;
      c.shape = decode_shape(ds.batch, ds.ctx);
      c.fp8 = fp8;
      const std::string shape = ctx_name(c.shape);
      if (!wanted(opt, "decode " + shape + " " + dt)) continue;
      c.build(uint64_t(ds.batch) * 7 + ds.ctx + fp8, l2);
      const int sets = int(c.sets.size());
      const bool main_shape = ds.batch == 32 && ds.ctx == 9216;
      // From 131072 tokens the indexer's target is the issue's: the index cache read at >= 85 %
      // of the copy rate (floor / 0.85).
      const bool long_ctx = ds.ctx >= 131072;
      // A row in the three timing modes (eager, one-call graph, batched graph); returns the last.
      auto emit_modes = [&](Row r, const std::function<void(int, cudaStream_t)>& fn) {
        r.mode = "eager";
        r.us = time_it(iters, sets, fn, false, st);
        emit(r, c);
        r.mode = "graph";
        r.us = time_it(iters, sets, fn, true, st);
        emit(r, c);
        r.mode = kBatchMode;
        r.us = time_it(iters, sets, fn, true, st, kGraphBatch);
        emit(r, c);
        return r;
      };
      // At the main shape, the batched-graph mode again with programmatic dependent launch of the
      // kernels in each mask (LaunchTuning::pdl_mask; 0: plain launches) instead of the default
      // choice (same process, same inputs): what PDL gives.
      auto with_pdl = [&](Row r, const std::function<void(int, cudaStream_t)>& fn,
                          std::initializer_list<int> masks = {0, 7}) {
        if (!main_shape) return;
        const std::string mode = r.mode;
        r.target_us = 0, r.target_note = "";
        for (const int mask : masks) {
          r.mode = mode + (mask ? ", PDL mask " + std::to_string(mask) : ", no PDL");
          {
            TuningEdit e([mask](cuda::Tuning& t) { t.launch.pdl_mask = mask; });
            r.us = time_it(iters, sets, fn, true, st, kGraphBatch);
          }
          emit(r, c);
        }
      };

      // Indexer: the planner's kernel (what run_indexer runs) with the targets, then each decode
      // kernel for comparison. A kernel without a plan for the shape is skipped.
      const double ifloor = c.index_bytes() / bw * 1e6;
      auto run_path = [&](cuda::IndexerKernel kernel) {
        return [&c, kernel](int s, cudaStream_t stream) {
          if (!cuda::run_indexer_kernel(c.indexer(s), stream, kernel)) throw Error("bench: indexer unsupported");
        };
      };
      // A kernel's own rows launch it plainly (unless --tune launch.pdl_mask chooses): with PDL,
      // each call of a graph of 16 would start under the one before, which a decode step does not
      // give it. The decode-step rows use the default PDL choice, as serving does.
      auto plain = [](const std::function<void(int, cudaStream_t)>& fn) {
        return [fn](int s, cudaStream_t stream) {
          if (cuda::tuning().launch.pdl_mask >= 0) return fn(s, stream);
          TuningEdit e([](cuda::Tuning& t) { t.launch.pdl_mask = 0; });
          fn(s, stream);
        };
      };
      struct IPath {
        cuda::IndexerKernel kernel;
        std::string name;
        bool target, eager;
        bool one_unit = false;  // IndexerTuning::persistent_long_unit -1 (the plan before it)
      };
      std::vector<IPath> ipaths = {{cuda::IndexerKernel::kAuto, "fused (default)", true, true},
                                   {cuda::IndexerKernel::kDecodeChunked, "fused v2 (chunked)", false, false},
                                   {cuda::IndexerKernel::kDecodeCluster, "fused v3 (cluster)", false, false},
                                   {cuda::IndexerKernel::kDecodePersistent, "fused v4 (persistent)", false, false}};
      // Long contexts with fp8: the planner's kernel again without the long-context plan, in the
      // same process on the same inputs (A/B of IndexerTuning::persistent_long_unit).
      if (long_ctx && fp8 && cuda::tuning().indexer.persistent_long_unit >= 0)
        ipaths.push_back({cuda::IndexerKernel::kAuto, "fused (long_unit -1)", false, false, true});
      warm_up(sets, run_path(cuda::IndexerKernel::kAuto), st, 20);
      for (const auto& ip : ipaths) {
        if (!row_wanted(opt, kDecodeIndexer)) break;
        std::optional<TuningEdit> old_plan;
        if (ip.one_unit) old_plan.emplace([](cuda::Tuning& t) { t.indexer.persistent_long_unit = -1; });
        if (!cuda::run_indexer_kernel(c.indexer(0), st, ip.kernel)) continue;
        Row r{kDecodeIndexer, shape, dt, "", 0, ifloor, "bytes"};
        if (ip.target) {
          r.target_us = main_shape ? (fp8 ? 12 : 22) : long_ctx ? ifloor / 0.85 : 1.4 * ifloor + 2;
          r.target_note = main_shape ? "issue target" : long_ctx ? "85 % of the copy rate" : "1.4 x floor + 2 us";
        }
        if (ip.eager) {
          r.mode = ip.name + ", eager";
          r.us = time_it(iters, sets, plain(run_path(ip.kernel)), false, st);
          emit(r, c);
        }
        r.mode = ip.name + ", graph";
        r.us = time_it(iters, sets, plain(run_path(ip.kernel)), true, st);
        emit(r, c);
        r.mode = ip.name + ", " + kBatchMode;
        r.us = time_it(iters, sets, plain(run_path(ip.kernel)), true, st, kGraphBatch);
        emit(r, c);
        if (ip.target) with_pdl(r, run_path(ip.kernel));
      }
      // Every cache block of the batch, per set (the blocks of the indexer and of dense attention).
      auto all_blocks = [&c](int s) {
        std::vector<int32_t> ids;
        for (size_t i = 0; i < c.shape.cached.size(); ++i)
          for (int b = 0; b < (c.shape.cached[i] + c.shape.qlen[i] + 127) / 128; ++b)
            ids.push_back(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(b)]);
        return ids;
      };
      // The read probe of a kernel's blocks (graph x16 per call, as the rows it is set against).
      // Where the kernels stream these bytes with the L2 evict-first policy, a second row reads
      // them under it too.
      auto probe_row = [&](const char* kernel, ReadProbe& pr, double floor_us) {
        Row r{kernel, shape, dt, kBatchMode, 0, floor_us, "bytes"};
        r.us = time_it(iters, sets, pr.fn(false), true, st, kGraphBatch);
        emit(r, c);
        if (!pr.kernels_use_l2_first()) return;
        std::string name = kernel;
        name.insert(name.size() - 1, ", L2 evict-first");
        Row h{name, shape, dt, kBatchMode, 0, floor_us, "bytes"};
        h.us = time_it(iters, sets, pr.fn(true), true, st, kGraphBatch);
        emit(h, c);
      };
      const uint32_t kv_block = 128 * 128 * (fp8 ? 1 : 2);
      if (row_wanted(opt, kProbeIndexer)) {
        ReadProbe pr;
        for (int s = 0; s < sets; ++s) {
          pr.add(size_t(s), c.sets[size_t(s)].ic->p, kv_block);
          pr.ids.push_back(upload(all_blocks(s)));
        }
        probe_row(kProbeIndexer, pr, ifloor);
      }

      // Leave a real selection in every set for the attention.
      for (int s = 0; s < sets; ++s) run_path(cuda::IndexerKernel::kAuto)(s, st);
      // K and V (and, fp8, their per-token scales) of a list of blocks, per set.
      auto kv_probe = [&](ReadProbe& pr, int s, const std::vector<int32_t>& ids) {
        const Set& set = c.sets[size_t(s)];
        pr.add(size_t(s), set.k->p, kv_block);
        pr.add(size_t(s), set.v->p, kv_block);
        if (fp8) {
          pr.add(size_t(s), set.ks->p, 128 * 4);
          pr.add(size_t(s), set.vs->p, 128 * 4);
        }
        pr.ids.push_back(upload(ids));
      };

      // Sparse attention.
      auto attn = [&c](bool sparse) {
        return [&c, sparse](int s, cudaStream_t stream) {
          if (!cuda::run_attention(c.attention(s, sparse), stream)) throw Error("bench: attention unsupported");
        };
      };
      const double afloor = c.attn_bytes(true) / bw * 1e6;
      Row a{"sparse decode attention", shape, dt, "", 0, afloor, "bytes"};
      a.target_us = main_shape ? (fp8 ? 7 : 11) : 0;
      a.target_note = main_shape ? "issue target" : "";
      if (row_wanted(opt, a.kernel)) with_pdl(emit_modes(a, plain(attn(true))), attn(true));
      if (row_wanted(opt, kProbeSparse)) {
        // The blocks each token's selection names (whole blocks: the own block's unused rows too).
        ReadProbe pr;
        cuda_check(cudaStreamSynchronize(st), "read probe selection");
        for (int s = 0; s < sets; ++s) {
          std::vector<int32_t> sel(size_t(c.T) * 16), ids;
          cuda_check(cudaMemcpy(sel.data(), c.sets[size_t(s)].topk->p, sel.size() * 4, cudaMemcpyDeviceToHost),
                     "read probe selection");
          for (size_t i = 0; i < c.shape.cached.size(); ++i)  // decode: token i is request i
            for (int k = 0; k < 16; ++k)
              if (const int b = sel[i * 16 + size_t(k)]; b >= 0)
                ids.push_back(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(b)]);
          kv_probe(pr, s, ids);
        }
        probe_row(kProbeSparse, pr, afloor);
      }

      // One decode step of a sparse layer: indexer + attention.
      auto step = [&](int s, cudaStream_t stream) {
        run_path(cuda::IndexerKernel::kAuto)(s, stream);
        attn(true)(s, stream);
      };
      Row sr{"decode step (indexer + sparse attention)", shape, dt, "", 0, ifloor + afloor, "bytes"};
      if (row_wanted(opt, sr.kernel)) with_pdl(emit_modes(sr, step), step);

      // One decode step of a sparse layer's attention as the model runs it: the cache write of the
      // step's tokens (q / k / index q / index k norm + RoPE; K, V and the index key stored at
      // each request's new position), the indexer (its query vectors and the new keys from the
      // cache write), the sparse attention. Norm weights 0 (Gemma's 1 + w = 1), so repeating the
      // in-place transform keeps the rows' magnitudes.
      // The cache write's inputs per set (projection rows, positions, slots), built for the
      // decode-step rows that start with it.
      DevPtr d_cs, w;
      std::vector<DevPtr> rows, poss, slots;
      if (row_wanted(opt, kFullDecodeStep) || row_wanted(opt, kDenseDecodeStep)) {
        std::vector<float> cs(size_t(c.max_seq) * 64);
        ops::build_rope_table(cs.data(), c.max_seq, 64, 5e6);
        d_cs = upload(cs);
        w = dev(128 * 2);
        fill(w->p, 0, 128, 5, 0.f);
        for (int s = 0; s < sets; ++s) {
          std::vector<int32_t> pos;
          std::vector<int64_t> slot;
          for (size_t i = 0; i < c.shape.cached.size(); ++i)
            for (int j = 0; j < c.shape.qlen[i]; ++j) {
              const int p = c.shape.cached[i] + j;
              pos.push_back(p);
              slot.push_back(int64_t(c.sets[size_t(s)].host_tables[i * size_t(c.mbps) + size_t(p / 128)]) * 128 + p % 128);
            }
          rows.push_back(dev(size_t(c.T) * kQkvStride * 2));
          fill(rows.back()->p, 0, size_t(c.T) * kQkvStride, 60 + s, 2.f);
          poss.push_back(upload(pos));
          slots.push_back(upload(slot));
        }
        cuda_check(cudaDeviceSynchronize(), "bench inputs");
      }
      if (row_wanted(opt, kFullDecodeStep)) {
        auto full_step = [&](int s, cudaStream_t stream) {
          const ops::AttentionParams base = c.attention(s, true);
          ops::IndexerParams ip = c.indexer(s);
          const auto p = qkv_params(rows[size_t(s)]->p, c.T, w->p, poss[size_t(s)]->as<int32_t>(), d_cs->as<float>(),
                                    slots[size_t(s)]->as<int64_t>(), base.kv, ip.cache);
          if (!cuda::run_qkv_norm_rope_cache(p, stream)) throw Error("bench: cache write unsupported");
          ip.index_q = static_cast<uint16_t*>(rows[size_t(s)]->p) + p.index_q_offset;
          ip.q_stride = kQkvStride;
          if (!cuda::run_indexer(ip, stream)) throw Error("bench: indexer unsupported");
          ops::AttentionParams ap = base;
          ap.q = rows[size_t(s)]->p;
          ap.q_stride = kQkvStride;
          if (!cuda::run_attention(ap, stream)) throw Error("bench: attention unsupported");
        };
        Row fr{kFullDecodeStep, shape, dt, "", 0,
               ifloor + afloor + qkv_bytes(c.T, fp8) / bw * 1e6, "bytes"};
        fr = emit_modes(fr, full_step);
        with_pdl(fr, full_step, {0, 2, 7});  // 2: the indexer only
      }

      // Dense attention (dense layers).
      const double dfloor = c.attn_bytes(false) / bw * 1e6;
      Row d{"dense decode attention", shape, dt, "", 0, dfloor, "bytes"};
      d.target_us = main_shape ? 1.3 * dfloor : 0;
      d.target_note = main_shape ? "1.3 x floor" : "";
      if (row_wanted(opt, d.kernel)) with_pdl(emit_modes(d, plain(attn(false))), attn(false));
      if (row_wanted(opt, kProbeDense)) {
        ReadProbe pr;
        for (int s = 0; s < sets; ++s) kv_probe(pr, s, all_blocks(s));
        probe_row(kProbeDense, pr, dfloor);
      }

      // One decode step of a dense layer's attention: the cache write (q / k norm + RoPE; K and V
      // stored at each request's new position; no index key), then dense attention over the
      // cache that now holds the new tokens.
      if (row_wanted(opt, kDenseDecodeStep)) {
        auto dense_step = [&](int s, cudaStream_t stream) {
          const ops::AttentionParams base = c.attention(s, false);
          auto p = qkv_params(rows[size_t(s)]->p, c.T, w->p, poss[size_t(s)]->as<int32_t>(), d_cs->as<float>(),
                              slots[size_t(s)]->as<int64_t>(), base.kv, ops::IndexCacheView{});
          p.num_index_heads = 0, p.index_dim = 0;
          if (!cuda::run_qkv_norm_rope_cache(p, stream)) throw Error("bench: cache write unsupported");
          ops::AttentionParams ap = base;
          ap.q = rows[size_t(s)]->p;
          ap.q_stride = kQkvStride;
          if (!cuda::run_attention(ap, stream)) throw Error("bench: attention unsupported");
        };
        Row dr{kDenseDecodeStep, shape, dt, "", 0, dfloor + qkv_bytes(c.T, fp8, false) / bw * 1e6, "bytes"};
        dr = emit_modes(dr, dense_step);
        with_pdl(dr, dense_step, {0, 4, 7});  // 4: attention only
      }
    }
  }

  // ---- Prefill. Attention at one TP4 rank's shape (16 q heads, one kv head), and the 8192-token
  // prompt again at one TP8 rank's (8 q heads: shape "8192 new tp8"; no indexer rows, the
  // indexer's shape is the same at both).
  struct PShape {
    int cached, n;
    int q_heads = 16;
  };
  for (const auto& ps : std::vector<PShape>{{0, 8192}, {0, 32768}, {57344, 8192}, {0, 8192, 8}}) {
    for (bool fp8 : {false, true}) {
      Case c;
      c.shape = prefill_shape(ps.cached, ps.n);
      c.fp8 = fp8;
      c.q_heads = ps.q_heads;
      const std::string dt = fp8 ? "fp8" : "bf16";
      const std::string shape = ctx_name(c.shape) + (ps.q_heads == 8 ? " tp8" : "");
      if (!wanted(opt, "prefill " + shape + " " + dt)) continue;
      if (fp8 && ps.n != 8192) continue;  // fp8 prefill: the 8192-token chunks
      c.build(uint64_t(ps.cached) + ps.n + fp8, l2);
      const int sets = int(c.sets.size());
      const double ifl = c.index_flops() / rate * 1e6;
      Row r{"prefill indexer", shape, dt, "eager", 0, ifl, "flops"};
      const bool index_rows = row_wanted(opt, r.kernel) && ps.q_heads == 16;
      if (!fp8 && ps.cached == 0) {
        r.target_us = ps.n == 8192 ? 35 : 280;
        r.target_note = "issue target";
      }
      auto prefill_fn = [&](int s, cudaStream_t stream) {
        if (!cuda::run_indexer_kernel(c.indexer(s), stream, cuda::IndexerKernel::kPrefill))
          throw Error("bench: indexer");
      };
      if (index_rows) {
        r.us = time_it(iters, sets, prefill_fn, false, st);
        emit(r, c);
        // The same call as a one-call CUDA graph: the kernels' time without the host's launch
        // calls (an eager call pays them inside its events: the empty kernel's eager row).
        r.mode = "graph";
        r.us = time_it(iters, sets, prefill_fn, true, st);
        emit(r, c);
        {
          // The same graph with the selection kernel waiting for the whole scoring grid.
          Row o = r;
          o.mode = "graph, selection not overlapped";
          o.target_us = 0, o.target_note = "";
          {
            TuningEdit e([](cuda::Tuning& t) { t.indexer.prefill_overlap = false; });
            o.us = time_it(iters, sets, prefill_fn, true, st);
          }
          emit(o, c);
        }
        r.mode = "eager, long-context kernel";
        r.target_us = 0, r.target_note = "";
        r.us = time_it(
            std::min(iters, 50), sets,
            [&](int s, cudaStream_t stream) {
              if (!cuda::run_indexer_kernel(c.indexer(s), stream, cuda::IndexerKernel::kPrefillLong))
                throw Error("bench: indexer");
            },
            false, st);
        emit(r, c);
      }
      for (int s = 0; s < sets; ++s) cuda::run_indexer(c.indexer(s), st);
      const double afl = c.attn_flops(true) / rate * 1e6;
      Row a{"sparse prefill attention", shape, dt, "eager", 0, afl, "flops"};
      if (!fp8 && ps.cached == 0 && ps.n == 8192) {
        a.target_us = afl * 2;
        a.target_note = ">= 50% of bf16 matrix rate";
      }
      auto attn_fn = [&](bool sparse) {
        return [&c, sparse](int s, cudaStream_t stream) { cuda::run_attention(c.attention(s, sparse), stream); };
      };
      // fp8: the row again with the blocks staged as an exact bf16 copy whose scales the tiles apply
      // (AttentionTuning::prefill_fp8_stage, prefill_fp8_stage_fold 0), staged with the scales
      // folded into the copy (prefill_fp8_stage_fold 1), that with the tiles launched plainly
      // (prefill_fp8_stage_pdl 0), staged with S on fp8 tensor cores (prefill_fp8_qk) and with the
      // tiles converting them, in one run (the row above times the default). At 8192 new tokens
      // without a prefix, also the staging alone (prefill_fp8_stage_only: the mark and conversion
      // kernels of the default folded copy, no tiles) against the bytes it must move: the staged
      // blocks' fp8 K and V and their scales read, their bf16 K and V written.
      auto stage_pair = [&](Row r, bool sparse) {
        if (!fp8) return;
        r.target_us = 0, r.target_note = "";
        const std::string mode = r.mode;
        // The fields each row sets (-1: as tuned): prefill_fp8_stage, _fold, prefill_fp8_qk,
        // prefill_fp8_stage_pdl.
        struct Variant {
          const char* suffix;
          int stage, fold, qk, pdl;
        };
        static const Variant variants[] = {{", fp8 staged, exact", 2, 0, 0, -1},
                                           {", fp8 staged, scales folded", 2, 1, 0, -1},
                                           {", fp8 staged, scales folded, no PDL", 2, 1, 0, 0},
                                           {", fp8 staged, fp8 S", 2, -1, 1, -1},
                                           {", fp8 converted in the tiles", 0, -1, -1, -1}};
        auto set = [](int& field, int value) {
          if (value >= 0) field = value;
        };
        for (const Variant& v : variants) {
          r.mode = mode + v.suffix;
          TuningEdit e([&v, &set](cuda::Tuning& t) {
            set(t.attention.prefill_fp8_stage, v.stage);
            set(t.attention.prefill_fp8_stage_fold, v.fold);
            set(t.attention.prefill_fp8_qk, v.qk);
            set(t.attention.prefill_fp8_stage_pdl, v.pdl);
          });
          r.us = time_it(iters, sets, attn_fn(sparse), false, st);
          emit(r, c);
        }
        if (ps.cached != 0 || ps.n != 8192) return;
        // The blocks the staging converts (the first set's; the others' selections are alike):
        // dense every block up to each request's length, sparse those some token selects (0 <=
        // block <= its own).
        int64_t staged = c.blocks_per_set;
        if (sparse) {
          std::vector<int32_t> sel(size_t(c.T) * 16);
          cuda_check(cudaMemcpy(sel.data(), c.sets[0].topk->p, sel.size() * 4, cudaMemcpyDeviceToHost),
                     "bench selections back");
          staged = 0;
          int64_t t0 = 0;
          for (size_t s = 0; s < c.shape.qlen.size(); ++s) {
            std::vector<char> hit(size_t(c.mbps), 0);
            for (int i = 0; i < c.shape.qlen[s]; ++i) {
              const int own = (c.shape.cached[s] + i) / 128;
              for (int k = 0; k < 16; ++k) {
                const int b = sel[size_t(t0 + i) * 16 + size_t(k)];
                if (b >= 0 && b <= own) hit[size_t(b)] = 1;
              }
            }
            for (char h : hit) staged += h;
            t0 += c.shape.qlen[s];
          }
        }
        // A block of one kv head: 2 x 16 KB fp8 and 2 x 512 B of scales read, 2 x 32 KB written.
        const double bytes = double(staged) * (2 * 16384 + 2 * 512 + 2 * 32768);
        Row o{r.kernel, r.shape, r.dtype, mode + ", fp8 staging alone", 0, bytes / bw * 1e6, "bytes"};
        {
          TuningEdit e([](cuda::Tuning& t) {
            t.attention.prefill_fp8_stage = 2;
            t.attention.prefill_fp8_stage_fold = 1;
            t.attention.prefill_fp8_qk = 0;
            t.attention.prefill_fp8_stage_only = 1;
          });
          o.us = time_it(iters, sets, attn_fn(sparse), false, st);
        }
        emit(o, c);
      };
      if (row_wanted(opt, a.kernel)) {
        a.us = time_it(iters, sets, attn_fn(true), false, st);
        emit(a, c);
        stage_pair(a, true);
        if (ps.n == 8192 && ps.cached == 0) {
          // The decode kernel (one row per token and kv head, its blocks streamed from L2): the
          // gain of the tiles that share K/V blocks.
          Row o = a;
          o.mode = "eager, per-token kernel";
          o.target_us = 0, o.target_note = "";
          {
            TuningEdit e([](cuda::Tuning& t) { t.attention.prefill_tiles = 0; });
            o.us = time_it(std::min(iters, 50), sets, attn_fn(true), false, st);
          }
          emit(o, c);
        }
        // The same attention over selections with a trained indexer's locality (selections.h:
        // neighbouring tokens share most blocks) instead of the indexer's over random inputs,
        // whose tokens select nearly independent blocks. Same FLOP floor: min(16, blocks) a token.
        std::vector<int32_t> ids(size_t(c.T) * 16);
        for (int s = 0; s < sets; ++s) {
          generate_selections(trained_like(), 16, 128, 1, ps.cached, ps.n, uint64_t(s) + 1, ids.data());
          cuda_check(cudaMemcpy(c.sets[size_t(s)].topk->p, ids.data(), ids.size() * 4, cudaMemcpyHostToDevice),
                     "bench selections");
        }
        Row t = a;
        t.mode = "eager, trained-like selections";
        t.us = time_it(iters, sets, attn_fn(true), false, st);
        emit(t, c);
        stage_pair(t, true);
        if (ps.n == 8192 && ps.cached == 0) {
          t.mode = "eager, trained-like selections, per-token kernel";
          t.target_us = 0, t.target_note = "";
          {
            TuningEdit e([](cuda::Tuning& tu) { tu.attention.prefill_tiles = 0; });
            t.us = time_it(std::min(iters, 50), sets, attn_fn(true), false, st);
          }
          emit(t, c);
        }
      }
      Row d{"dense prefill attention", shape, dt, "eager", 0, c.attn_flops(false) / rate * 1e6, "flops"};
      if (!row_wanted(opt, d.kernel)) continue;
      d.us = time_it(iters, sets, attn_fn(false), false, st);
      emit(d, c);
      stage_pair(d, false);
      if (ps.n == 8192 && ps.cached == 0) {
        d.mode = "eager, per-token kernel";
        {
          TuningEdit e([](cuda::Tuning& t) { t.attention.prefill_tiles = 0; });
          d.us = time_it(std::min(iters, 50), sets, attn_fn(false), false, st);
        }
        emit(d, c);
      }
    }
  }

  // ---- Cache write (qkv norm + RoPE + KV/index cache), decode b32 and prefill 8192.
  for (int tokens : {32, 8192}) {
    for (bool fp8 : {true, false}) {
      const std::string dt = fp8 ? "fp8" : "bf16";
      const std::string shape = std::to_string(tokens) + " tokens";
      if (!wanted(opt, "cache write " + shape + " " + dt) || !row_wanted(opt, kCacheWrite)) continue;
      const int nsets = 4;
      std::vector<DevPtr> rows, kc, vc, ksc, vsc, icc;
      const size_t slots = size_t(tokens) * 4;
      std::vector<int64_t> slot_map(static_cast<size_t>(tokens));
      std::vector<int32_t> pos(static_cast<size_t>(tokens));
      for (int t = 0; t < tokens; ++t) slot_map[size_t(t)] = int64_t(t) * 3 % int64_t(slots), pos[size_t(t)] = t;
      auto d_slots = upload(slot_map), d_pos = upload(pos);
      std::vector<float> cs(size_t(tokens) * 64);
      ops::build_rope_table(cs.data(), tokens, 64, 5e6);
      auto d_cs = upload(cs);
      auto w = dev(128 * 2);
      fill(w->p, 0, 128, 5, 0.5f);
      for (int s = 0; s < nsets; ++s) {
        rows.push_back(dev(size_t(tokens) * kQkvStride * 2));
        fill(rows.back()->p, 0, size_t(tokens) * kQkvStride, 40 + s, 2.f);
        kc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
        vc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
        ksc.push_back(dev(slots * 4));
        vsc.push_back(dev(slots * 4));
        icc.push_back(dev(slots * 128 * (fp8 ? 1 : 2)));
      }
      auto params = [&](int s) {
        ops::KvCacheView kv;
        kv.k = kc[size_t(s)]->p, kv.v = vc[size_t(s)]->p;
        kv.k_scale = ksc[size_t(s)]->as<float>(), kv.v_scale = vsc[size_t(s)]->as<float>();
        kv.dtype = fp8 ? DType::FP8_E4M3 : DType::BF16;
        kv.num_blocks = int64_t(slots / 128), kv.block_size = 128, kv.num_kv_heads = 1, kv.head_dim = 128;
        ops::IndexCacheView ic;
        ic.k = icc[size_t(s)]->p;
        ic.dtype = kv.dtype;
        ic.num_blocks = kv.num_blocks, ic.block_size = 128, ic.index_dim = 128;
        return qkv_params(rows[size_t(s)]->p, tokens, w->p, d_pos->as<int32_t>(), d_cs->as<float>(),
                          d_slots->as<int64_t>(), kv, ic);
      };
      cuda_check(cudaDeviceSynchronize(), "bench inputs");
      Row r{kCacheWrite, shape, dt, "eager", 0, qkv_bytes(tokens, fp8) / bw * 1e6, "bytes"};
      r.us = time_it(iters, nsets, [&](int s, cudaStream_t stream) { cuda::run_qkv_norm_rope_cache(params(s), stream); }, false, st);
      r.runs = iters, r.input_sets = nsets;
      on_row(r);
      r.mode = "graph";
      r.us = time_it(iters, nsets, [&](int s, cudaStream_t stream) { cuda::run_qkv_norm_rope_cache(params(s), stream); }, true, st);
      on_row(r);
    }
  }
  // ---- MoE experts of one TP4 rank (hidden 6144, 768 intermediate units of each of 128 experts,
  // top-4, BF16 weights, fp32 activations as the model runs them): decode batches of 32 and 256
  // tokens and a batch of 1024, bound by the routed experts' weights, and a prefill of 8192
  // tokens, bound by its FLOPs. Tokens route to 4 distinct experts drawn uniformly. Tensor cores
  // (the default, with the tile size it picks) against the other tile size
  // (MoeTuning::tile_rows) and, at 32 and 8192 tokens, the fp32 SIMT products
  // (MoeTuning::force_simt).
  if (row_wanted(opt, kMoe)) {
    constexpr int64_t H = 6144, I = 768;
    constexpr int E = 128, K = 4;
    std::vector<DevPtr> gu, dn;
    std::vector<const void*> gu_p, dn_p;
    for (int e = 0; e < E; ++e) {
      gu.push_back(dev(size_t(2 * I * H) * 2));
      dn.push_back(dev(size_t(H * I) * 2));
      fill(gu.back()->p, 0, size_t(2 * I * H), 900 + e, 0.02f);
      fill(dn.back()->p, 0, size_t(H * I), 1900 + e, 0.02f);
      gu_p.push_back(gu.back()->p);
      dn_p.push_back(dn.back()->p);
    }
    auto d_gu = upload(gu_p), d_dn = upload(dn_p);
    std::mt19937 rng(77);
    for (int tokens : {32, 256, 1024, 8192}) {
      const std::string shape = std::to_string(tokens) + " tokens";
      if (!wanted(opt, "moe " + shape + " bf16")) continue;
      std::vector<int32_t> ids(size_t(tokens) * K);
      std::vector<float> wts(ids.size());
      std::vector<char> used(E, 0);
      for (int t = 0; t < tokens; ++t) {
        std::vector<int32_t> perm(E);
        std::iota(perm.begin(), perm.end(), 0);
        for (int j = 0; j < K; ++j) {
          std::swap(perm[size_t(j)], perm[size_t(j) + rng() % size_t(E - j)]);
          ids[size_t(t) * K + size_t(j)] = perm[size_t(j)];
          wts[size_t(t) * K + size_t(j)] = 0.25f;
          used[size_t(perm[size_t(j)])] = 1;
        }
      }
      const double experts = double(std::count(used.begin(), used.end(), 1));
      auto d_ids = upload(ids), d_w = upload(wts);
      auto x = dev(size_t(tokens * H) * 4), out = dev(size_t(tokens * H) * 4);
      fill(x->p, 2, size_t(tokens * H), 31, 2.f, -1.f);
      fill(out->p, 2, size_t(tokens * H), 32, 2.f, -1.f);
      ops::MoeExpertsParams p;
      p.x = x->p;
      p.act_dtype = DType::F32;
      p.num_tokens = tokens, p.hidden = H, p.inter = I, p.num_experts = E, p.topk = K;
      p.ids = d_ids->as<int32_t>();
      p.weights = d_w->as<float>();
      p.w_gate_up = d_gu->as<const void*>();
      p.w_down = d_dn->as<const void*>();
      p.w_dtype = DType::BF16;
      p.out = out->p;
      cuda_check(cudaDeviceSynchronize(), "bench inputs");
      // Floor: the routed experts' weights once (and the rows in and out), or the products'
      // FLOPs, whichever takes longer.
      const double bytes = experts * double(3 * H * I) * 2 + double(tokens * H) * 4 * 3;
      const double flops = double(tokens) * K * 2.0 * 3.0 * double(H * I);
      const bool by_flops = flops / rate > bytes / bw;
      const double floor_us = (by_flops ? flops / rate : bytes / bw) * 1e6;
      auto fn = [&](int, cudaStream_t stream) { cuda::run_moe_experts(p, stream); };
      // The tile size moe_experts picks (16 rows up to 8 pairs an expert) and the other one.
      const int auto_rows = tokens * K <= 8 * E ? 16 : 64;
      for (int variant = 0; variant < 3; ++variant) {
        if (variant == 2 && tokens != 32 && tokens != 8192) continue;
        const bool simt = variant == 2;
        const int rows = variant == 1 ? 80 - auto_rows : 0;
        TuningEdit e([&](cuda::Tuning& t) {
          t.moe.force_simt = simt;
          t.moe.tile_rows = rows;
        });
        const std::string mode = simt ? "simt fp32"
                                 : "tensor cores, " + std::to_string(rows ? rows : auto_rows) + "-row tiles" +
                                       (rows ? "" : " (default)");
        Row r{kMoe, shape, "bf16", mode, 0, floor_us, by_flops ? "flops" : "bytes"};
        r.runs = iters, r.input_sets = 1;
        r.us = time_it(simt && tokens > 32 ? std::min(iters, 10) : iters, 1, fn, false, st);
        if (simt && tokens > 32) r.runs = std::min(iters, 10);
        on_row(r);
        if (variant == 0) {
          r.mode = mode + ", graph";
          r.us = time_it(iters, 1, fn, true, st);
          on_row(r);
        }
      }
    }
  }

  run_chain_rows(opt, env, on_row);
  run_moe_fp8(opt, env, on_row, st);
  run_sample_rows(opt, env, on_row, st);

  run_linear_rows(opt, env, on_row);
  cuda_check(cudaStreamSynchronize(st), "bench end");
  cudaStreamDestroy(st);
}

}  // namespace sieve::kernels_bench

