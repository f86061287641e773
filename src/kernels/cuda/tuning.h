// The chosen defaults of the CUDA kernels, one struct per subsystem. Serving never changes them:
// only the parity tests (to force a path or a grid) and `sieve bench kernels --tune` (to time
// one) do, between calls, from the thread that launches. A field at its default means "the rule
// the kernel's host code documents"; -1 or 0 usually says so. Kernels never read the environment.
#pragma once

#include <string>
#include <vector>

namespace sieve::cuda {

// Programmatic dependent launch and L2 policies shared by the decode-step kernels (common.cuh).
struct LaunchTuning {
  // -1: the measured default (decode indexers always, sparse attention up to 4 query tokens,
  // dense attention up to 128, the cache write by chain_pdl's rule); else a mask of PdlKernel
  // (1 cache write, 2 decode indexers, 4 attention; 0 none, 7 all).
  int pdl_mask = -1;
  // The small kernels of a decode step (rms_norm, add, embedding, swiglu_oai, moe_route's
  // routing kernels, and the cache write while pdl_mask is -1) launched with programmatic
  // dependent launch: -1 for calls of at most kPdlChainMaxRows rows, not on the legacy stream
  // (common.cuh), 0 never, 1 at every size.
  int chain_pdl = -1;
  // An experiment, off: decode steps (at most 64 rows) prefetch into L2, on a stream beside a
  // MoE layer's routing, the next layer's weights that its first GEMMs read (qkv, o_proj, the
  // shared expert's gate_up and down, with their scales, in that order) up to this many MiB;
  // 0: never. A first form (bulk prefetches from a few CTAs, joined before the experts) made one
  // TP8 rank's decode step 16 % slower on an H100 (docs/performance.md "Measured and not kept");
  // this form (line prefetches from many CTAs, joined after the experts) is not measured yet.
  int l2_prefetch_mib = 0;
};

// ops::linear with FP8 weights (linear_fp8.cu, linear_fp8_plan.h; docs/kernels.md "FP8 GEMM").
// 0 (or -1 where stated) is the documented rule.
struct LinearTuning {
  // 0 auto (m <= 64: the wgmma kernel; more: cuBLASLt block scaling where the weight's scales
  // allow it, else the wgmma kernel), 1 the wgmma kernel at every m, 2 cuBLASLt block scaling
  // (the op answers "unsupported" where cuBLASLt refuses).
  int backend = 0;
  // The wgmma kernel's plan: consumer warpgroups a CTA (1, 2), tokens a CTA (8, 16, 32, 64,
  // 128), CTAs along k of a tile (1..8), ring depth (2..8), the resident CTAs an SM the split
  // rule aims at (0: 2).
  int wgs = 0, bn = 0, splits = 0, stages = 0, max_ctas_per_sm = 0;
  // Programmatic dependent launch of the decode GEMM (m <= 64) and of the quantizer before it:
  // the weights of the first stages load while the previous kernel finishes.
  bool pdl = true;
  // F32 / BF16 rows quantized inside the GEMM (no quantize kernel) up to this many tokens; 0:
  // never, the rule (an H100 measured it slower than the quantize kernel with programmatic
  // dependent launch at every decode shape: 1.5 x at m = 1, far more at m = 32).
  int fuse_quant_max_m = 0;
};

// The lightning indexer (cuda/indexer/).
struct IndexerTuning {
  // Decode kernels score with the narrow MMA where a request has at most 8 query vectors (same
  // outputs bit for bit); false: always the 16-row MMA.
  bool narrow_mma = true;
  // Key blocks copied with an L2 evict-first policy (decode cluster and persistent kernels):
  // -1 by the stream's size (l2_evict_first), 0 never, 1 always.
  int l2_evict_first = -1;
  // Synchronise every call made outside a stream capture and print where its CTAs spent their
  // time (decode cluster / persistent kernels and the prefill kernel; stderr).
  bool trace = false;

  // Decode, chunked kernel (v2): at most this many chunks a request (0: the grid rule).
  int chunked_max_chunks = 0;

  // Decode, cluster kernel (v3): cluster size (1, 2, 4, 8) and groups per request (> 1: a
  // second, global merge level); 0: the grid rule. Forcing either skips the residency fallback.
  int cluster_size = 0, cluster_groups = 0;
  // Shared-memory budget per CTA in KB for the key ring (0: 110, or 200 alone on an SM), and at
  // most this many ring stages (0: as many as fit).
  int cluster_budget_kb = 0, cluster_max_stages = 0;
  // The chunk top-k unrolled by 8 and the merges by branch-free binary searches (same results).
  bool cluster_merge_ilp = false;

  // Decode, persistent kernel (v4); 0: the rule for each. Key blocks per work unit, stages of
  // the key ring, CTAs in the grid (at most), static units per CTA, resident CTAs per SM (1, 2,
  // or 3 with fp8).
  int persistent_unit = 0, persistent_stages = 0, persistent_grid = 0, persistent_statics = 0,
      persistent_ctas_per_sm = 0;
  // The first unit's old key blocks before its query rows also without PDL.
  bool persistent_early_copies = false;
  // false: the counter finish also when every unit is static (else the polled finish).
  bool persistent_poll = true;
  // Long contexts with an fp8 cache (planner.cu persistent_long_plan): units of this many blocks
  // claimed from the counter, so a CTA whose copies are served late takes fewer units, with the
  // polled finish (persistent_claim_poll). 0 (the rule): units of 2 past 2048 blocks a request,
  // where v2 ran before; > 0: units of this many from 512 blocks, also where one unit a CTA fits
  // (slower there on an H100: b8 ctx131072 66.7 against 53.5 us); -1: never (v2 past 2048).
  int persistent_long_unit = 0;
  // The polled finish with claimed units (every CTA of the persistent grid is resident, so a
  // selecting finisher may wait for units that other CTAs claimed): -1 the rule (where the long
  // plan above runs), 0 never (the counter finish wherever units are claimed), 1 wherever the
  // grid claims units.
  int persistent_claim_poll = -1;

  // Prefill kernel: the MMA form (kAuto: rs / rsp with a bf16 cache by the work per CTA, ss with
  // fp8), whether the selection kernel overlaps the scoring grid's tail, and the stream-K cost
  // of a tile's setup in key blocks (0..64).
  enum class PrefillMma { kAuto = -1, kSS = 0, kRS = 1, kRSP = 4 };
  PrefillMma prefill_mma = PrefillMma::kAuto;
  bool prefill_overlap = true;
  int prefill_setup_units = 1;
};

// Paged attention (cuda/attention/ and attention_prefill.cu).
struct AttentionTuning {
  // Decode kernel grid: largest cluster (1..8), most ring stages (2..12), splits a row (0: the
  // rule), consumer groups a CTA (0: the rule, 1 or 2).
  int max_cluster = 8, max_stages = 12, splits = 0, consumer_groups = 0;
  // Q by one bulk copy: -1 the measured rule, 0 never, 1 wherever the rows are aligned.
  int q_bulk = -1;
  // K/V copies with an L2 evict-first policy: -1 by the stream's size, 0 never, 1 always.
  int l2_evict_first = -1;
  // Two clusters a row merge through flagged records when the whole grid is resident (true), or
  // always through partials and a last-CTA counter (false).
  bool flagged_merge = true;
  // 1: synchronise every call and print the CTAs' phase times; 2: also every CTA's (stderr).
  int trace = 0;
  // Prefill tiles (attention_prefill.cu): -1 the rule (a chunk of at least 8 new tokens and at
  // least 512 in all), 0 never, 1 for every batch they support.
  int prefill_tiles = -1;
  // Sparse prefill tiles give blocks read by one token their own path (bf16 cache).
  bool prefill_solo = true;
  // fp8 cache: the prefill tiles run the bf16 path (TMA, 3-stage ring) over a bf16 copy of the
  // blocks the call reads, staged in the workspace by a conversion kernel (the same results),
  // for dense calls (1) or dense and sparse calls (2, the default); 0: the tile's threads convert
  // each block into a 2-stage ring themselves (docs/kernels.md).
  int prefill_fp8_stage = 2;
  // Staged fp8: the per-key k and v scales read from global memory (L1) beside the 3-stage ring
  // (0), or copied with each block into a 2-stage ring (1).
  int prefill_fp8_stage_scales = 0;
  // Staged fp8: the largest copy (MiB) a call may stage; a larger call converts in the tiles.
  int prefill_fp8_stage_max_mib = 256;
  // Staged fp8: 1 (the default) folds the scales into the copy (K as bf16(k * k_scale), V as
  // bf16(v * v_scale)) and the tiles run the plain bf16 path over it (no per-key scales in the
  // tiles; one more bf16 rounding of each K and V element); 0 converts exactly and scales S and P
  // in the tiles (15-18 % slower at 8192 tokens, docs/performance.md).
  int prefill_fp8_stage_fold = 1;
  // Staged fp8: 1 computes S = Q K^T on fp8 tensor cores (wgmma e4m3: K fp8 from the copy with
  // its k scales, Q quantized per (token, head) row to e4m3 with an amax / 448 scale; V folded
  // into the copy as with prefill_fp8_stage_fold). Q loses mantissa bits (3 against bf16's 7).
  int prefill_fp8_qk = 0;
  // Staged fp8: 1 (the default) launches the tiles with programmatic dependent launch behind the
  // conversion kernel (their prologue overlaps its tail; not on the legacy default stream); 0 a
  // plain launch. The same results.
  int prefill_fp8_stage_pdl = 1;
  // Staged fp8, an experiment: 1 runs the staging alone (those of the memset, mark and conversion
  // kernels the call needs) and skips the tiles, so the output is not written (the benchmark's
  // "fp8 staging alone" rows).
  int prefill_fp8_stage_only = 0;
};

// moe_experts (moe.cu; FP8 weights: moe_fp8*.cu) and moe_route (moe_route.cu).
struct MoeTuning {
  // At most this many tokens a chunk (0: as many as the 1 GiB scratch holds).
  long long chunk_tokens = 0;
  // The fp32 SIMT products for BF16 weights too.
  bool force_simt = false;
  // Tensor-core tiles of 16 or 64 rows for every batch (0: by the batch).
  int tile_rows = 0;
  // FP8 weights: 0 the rule (the stream kernels while the (token, expert) pairs are at most
  // fp8_stream_pairs_per_expert x experts, else the tile kernels), 1 stream kernels, 2 tiles.
  int fp8_path = 0;
  int fp8_stream_pairs_per_expert = 48;
  // Token rows of a stream kernel's work unit: 8, 16, 32 or 64 (0: by the rows per expert).
  int fp8_stream_rows = 0;
  // K splits of the stream kernels (0: enough units to fill the GPU twice).
  int fp8_ksplit_gate_up = 0, fp8_ksplit_down = 0;
  // K blocks of 128 a stream kernel's pipeline stage holds (1 to 4; 0: 2 at 8 and 16 token rows,
  // 1 above, where the token boxes make a stage too large for more than two in flight). Two
  // read each weight row 256 contiguous bytes at a time: 32 tokens at one TP4 rank took 517
  // instead of 605 us on an H100 (docs/kernels.md).
  int fp8_stream_kblocks = 0;
  // Programmatic dependent launch along the stream path's kernels.
  bool fp8_pdl = true;
  // The next three: on (H100, 32 tokens: 515 -> 510 us at TP4, 289 -> 283 at TP8; 1 token
  // 64.8 -> 58.4 / 58.1 -> 51.8 us; docs/performance.md "MoE experts, FP8 weights").
  // Stream path with fp8_pdl: the sort launched with programmatic dependent launch too, its
  // checks and writes of the map cache's maps (which do not depend on the routing) before it
  // waits for moe_route.
  bool fp8_sort_pdl = true;
  // The sort's prefix over the experts by warp scans (false: one thread's serial loop).
  bool fp8_sort_scan = true;
  // The experts' weight tensor maps kept per weight set (device memory keyed by the pointer
  // arrays and shapes, first made outside stream capture) and rewritten by the sort only where an
  // expert's address changed, instead of all 2 x experts maps written every call.
  bool fp8_map_cache = true;
  // Stream kernels: the k split picked by the kernel from the row blocks the sort found, for the
  // least time of the busiest persistent CTA (moe_fp8_work.h pick_ksplit), up to this many splits
  // (bounded by a 32 MiB partial-sum buffer; 0: the host's rule above), at up to 32 token rows a
  // unit. fp8_ksplit_* override it.
  int fp8_ksplit_waves = 0;
  // Stream kernels, timing experiments (wrong results): 1 the weight scales not loaded (neither
  // the row-major cp.async nor the tiled bulk copy, nor their bytes), 2 also no products (the
  // consumers only wait and release the stages). 0: off.
  int fp8_stream_experiment = 0;
  // Tile kernels, timing experiments (wrong results): 1 every tile's weights (and their scales)
  // from expert 0, so they come from L2; 2 every tile's activation rows from the buffer's first
  // 128; 3 both; 4 no products and no epilogue (the consumers only wait and release the stages);
  // 7 as 3 (every operand from L2) with the products but no epilogue (nothing stored). 0: off.
  int fp8_tile_experiment = 0;
  // Tile kernels (prefill): the 1 x 128 activation scales laid out k-block-major ([k block][row],
  // by the quantizer and gate_up's epilogue) and the experts' weight scales copied tiled
  // (ops::fp8_scales_moe_tiled) once a call, so that the producer reads a stage's 384 scales from
  // ~12 cache lines instead of 384 (false: the row-major layouts, one line a scale; ignored when
  // the weights' scales come tiled, MoeExpertsParams::scale_tiled, which only these modes read).
  bool fp8_tile_kmajor_scales = true;
  // Tile kernels with k-block-major scales: a stage's scales by bulk copies counted in its
  // barrier's bytes (one arrival a stage, as the operands), not by 4-byte cp.async from 32 lanes
  // that each arrive when their copies land.
  bool fp8_tile_bulk_scales = true;
  // Tile kernels with k-block-major scales: the experts' weight tensor maps as a kernel parameter
  // (encoded on the host, which reads the expert pointer arrays: one stream synchronisation a
  // call; never under stream capture or with more than 128 experts) instead of maps written in
  // global memory by the sort kernel. false: the device-written maps.
  bool fp8_tile_param_maps = true;
  // Tile kernels with bulk scales and weight blocks of 128 rows or more (HF fp8, --quantization
  // fp8): the promotion takes one weight multiplier for each 64-row gate or up run of a half
  // (down: each half) instead of one a column; the same products (false: one a column).
  bool fp8_tile_block_scales = true;
  // Tile kernels with bulk scales: each consumer warpgroup's epilogue writes its 64 output rows
  // into a shared-memory buffer of their own and its first warp's lanes store them with one bulk
  // copy a row, which runs on while the warpgroup starts its next tile (down then has 3 ring
  // stages, not 4); otherwise each thread stores its fragments directly (4-byte bf16 pairs /
  // 2-byte fp8 pairs of 8 rows an instruction). 1 always, 0 never, -1 when a chunk's pairs
  // average at least 128 rows an expert (H100: staged 5-10 % faster at 8192 tokens, 256 rows an
  // expert; 5-9 % slower at 1024 tokens, 32 rows, not analysed: down there also gives up its
  // fourth ring stage; between them not measured).
  int fp8_tile_staged_out = -1;
  // Tile kernels: a CTA claims its next tile from a counter when it has issued the last k block
  // of its current one (the dynamic order), instead of taking tile blockIdx.x + k gridDim.x (the
  // static order): the CTAs that share an expert's weight tile then start it together, so that
  // the second reads its k blocks from L2, even after tiles of unequal cost. The same sums. H100,
  // 8192 tokens TP4: gate_up's DRAM reads 2.65 -> 1.57 GB (its bytes once), 1.12 -> 1.00 ms;
  // down's 1.15 GB -> 649 MB, 673 -> 594 us.
  bool fp8_tile_dynamic = true;
  // moe_route: the router GEMM fused into the routing kernel up to this many tokens (0: never;
  // BF16 x always takes it). Off: on an H100 the fused kernel took 15 / 67 / 128 us at 1 / 32 /
  // 64 tokens where matmul + routing took 12 / 19 / 20 us (hidden 6144, 128 experts, f32 x).
  long long route_fused_max_tokens = 0;
  // moe_route, F32 x: the router GEMM split over hidden slices of 128 (a CTA a slice and 32
  // experts, partial sums added in a fixed order by the routing kernel) up to this many tokens
  // (0: never); larger batches run matmul (cuBLAS) then the routing kernel. On an H100 (hidden
  // 6144, 128 experts) alone 10.6 / 15.6 / 25.2 us at 1 / 32 / 64 tokens against 12.6 / 19.4 /
  // 20.6 for matmul + routing, but within a TP8 decode step it pays only with the shared expert
  // beside it on the side stream (LoadOptions::side_stream, which follows this rule through
  // ops::moe_route_splits): step 22.36 ms against 22.75 with neither, 23.13 with split-K alone.
  long long route_splitk_max_tokens = 32;
  // Warps a split-K CTA, 16 hidden columns each: 8 (slices of 128) or 4 (slices of 64, twice
  // the CTAs and slices to add).
  int route_splitk_warps = 8;
};

struct Tuning {
  LaunchTuning launch;
  LinearTuning linear;
  IndexerTuning indexer;
  AttentionTuning attention;
  MoeTuning moe;
};

// The values in force (the defaults above unless a test or the benchmark changed them).
const Tuning& tuning();
void set_tuning(const Tuning& t);

// Sets `t` for the scope's lifetime and restores the values before it (tests: also when an
// assertion fails).
class TuningScope {
 public:
  explicit TuningScope(const Tuning& t) : saved_(tuning()) { set_tuning(t); }
  ~TuningScope() { set_tuning(saved_); }
  TuningScope(const TuningScope&) = delete;
  TuningScope& operator=(const TuningScope&) = delete;

 private:
  Tuning saved_;
};

// `sieve bench kernels --tune`: sets the field named `name` ("indexer.persistent_unit",
// "attention.trace", ...) of `t` from `value` (integers; true / false or 1 / 0 for flags; ss, rs,
// rsp or auto for indexer.prefill_mma). Throws Error naming the field on an unknown name or a
// bad value.
void set_tuning_field(Tuning& t, const std::string& name, const std::string& value);
// Every name set_tuning_field knows, with its default.
std::vector<std::string> tuning_field_names();

}  // namespace sieve::cuda
