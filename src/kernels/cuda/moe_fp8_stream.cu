// FP8 MoE, stream kernels (decode batches; docs/kernels.md "FP8 MoE"): bound by reading the routed
// experts' fp8 weights once, so the weights are wgmma's A operand (64 weight rows an instruction,
// "swap AB") and the expert's few token rows its N (8, 16, 32 or 64 columns): no tensor work is
// spent on padding rows, and a work unit streams 256 weight rows x its k range.
//
// A persistent CTA of three warpgroups takes work units i = blockIdx.x, + gridDim.x, ... in the
// order expert, (weight-row block, k split), token block (token blocks fastest: units that read
// the same weights run together):
//  - warpgroup 0, warp 0: the producer. Lane 0 issues the TMA loads of g.kp k blocks a stage
//    into a ring of stages (per k block the 256 weight rows as four 64-row boxes through the
//    expert's tensor map, with the L2 evict-first policy: each weight byte is read once; the
//    token rows as one box) and the scales' bulk copies, all counted in the stage's bytes, so
//    that the stage completes on lane 0's one arrival. The weight-row scales: tiled (GemmArgs::
//    wtiled, [rbs][nkb][256]), the stage's kp k blocks of the unit's row block are one run, one
//    bulk copy of kp KB; row-major, the 32 lanes copy them by 4-byte cp.async (and arrive: 33
//    arrivals). The token rows' scales (k-block-major, [nkb][rows_cap]): a bulk copy a k block
//    from the 16-byte boundary at or before the unit's first row. What a unit's copies need (the
//    boxes' first weight rows, the scales' addresses, the stage's bytes) is found once a unit.
//    Two k blocks a stage (decode) read each weight row 256 contiguous bytes at a time and halve
//    the barrier round trips a byte: 514 instead of 600 us at 32 tokens.
//  - warpgroups 1 and 2: the consumers, weight rows 0-127 and 128-255 (two m64 blocks each). Per k
//    block: 8 wgmma.m64nNk32 into temporary accumulators, one wait, then the promotion final +=
//    temporary * (weight scale of the row * x scale of the token) in fp32 (as in the tile
//    kernels). (Stages of one 64-row box worked by one warpgroup were slower, and loops that
//    overlap the products with the promotion gained nothing: docs/performance.md "Measured and
//    not kept".)
// gate_up: the 256 weight rows are [gate u0..u0+63 | up u0..u0+63 | gate u0+64.. | up u0+64..],
// so warpgroup c holds the gate and up sums of units u0 + 64 c + 0..63 in the same registers of
// its two blocks. The epilogue applies SwiGLU-OAI, takes each token's amax over the 128 units (a
// warp reduction, then the 8 warps through shared memory) and writes the token rows quantized for
// down. down: 256 hidden rows; the epilogue writes each token's output row (bf16).
// K splits (few units for the GPU, e.g. one decode token): each split writes its fp32 partial sums
// to global memory and counts itself in; the last split of a row block sums the partials in split
// order (so the result does not depend on which came last) and runs the epilogue.
// Programmatic dependent launch (knob): the producer loads the weights of its first stages before
// it waits for the previous kernel (griddepcontrol.wait), and the token rows after; every thread
// passes the wait before it writes global memory or exits.
#include <cuda.h>

#include "core/error.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise.cuh"
#include "kernels/cuda/moe_fp8.cuh"
#include "kernels/cuda/moe_fp8_work.h"

namespace sieve::cuda::moe_fp8 {

namespace {

constexpr int kW = 256, kBK = 128, kThreads = 384, kBox = 64 * kBK, kWBytes = kW * kBK;
constexpr int kMaxKp = 4, kMaxStages = 16;
constexpr int kRingBytes = 210 * 1024;  // bytes in flight: what a decode SM streams with

// A stage: kp k blocks of the unit's 256 weight rows (four 64-row boxes each) and of its token
// rows, then their scales ([kp][256] weight rows, [kp][kTs] token rows), 1024-aligned. Two k
// blocks a stage (decode) read each weight row 256 contiguous bytes at a time.
template <int kNt>
struct Geo {
  static constexpr int kTokBox = kNt * kBK;
  static constexpr int kStageK = kWBytes + kTokBox;  // weight and token bytes of one k block
  // A k block's token-row scales: the unit's rows from the 16-byte boundary at or before its
  // first row (up to 3 more), a multiple of 4 floats so that each k block's run is 16-byte aligned.
  static constexpr int kTs = kNt + 4;
  static constexpr int kScales = kW + kTs;  // floats of a k block's scales
  __host__ __device__ static constexpr int stride(int kp) {
    return (kp * kStageK + kp * kScales * 4 + 1023) / 1024 * 1024;
  }
  __host__ __device__ static constexpr int stages(int kp) {
    return kRingBytes / stride(kp) < kMaxStages ? kRingBytes / stride(kp) : kMaxStages;
  }
  // [ring][full][empty][epilogue amax exchange][flag]
  static constexpr size_t kBytes = 1024 + size_t(kRingBytes) + 2 * kMaxStages * 8 + 8 * kNt * 4 + 16;
};

struct Unit {
  int e, rb, ks, r0, rows;
  int64_t pe;  // the row block's partial-sum slot: global token block * rbs + rb
};
// cols, ksplit: the call's (GemmArgs::cols and ksplit, or the kernel's own pick).
__device__ __forceinline__ Unit unit_of(const GemmArgs& g, int64_t i, int nt, int cols, int ksplit) {
  const WorkItem w = work_item(g.blk_start, g.E, i, cols);
  Unit u;
  u.e = w.e;
  u.rb = w.col / ksplit;
  u.ks = w.col - u.rb * ksplit;
  u.r0 = g.offsets[w.e] + w.blk * nt;
  u.rows = min(nt, g.offsets[w.e + 1] - u.r0);
  u.pe = int64_t(g.blk_start[w.e] + w.blk) * (cols / ksplit) + u.rb;
  return u;
}

template <bool kGateUp>
__device__ __forceinline__ int weight_row(const GemmArgs& g, int rb, int c, bool& valid) {
  return kGateUp ? gate_up_row(rb, c, g.inter, valid) : down_row(rb, c, g.hidden, valid);
}

// One 64-row weight box (`wbox`) times the token rows (`t_addr`) over one k block: 4
// wgmma.m64nNk32 into acc (not committed).
template <int kNt>
__device__ __forceinline__ void box_product(float (&acc)[kNt / 2], const uint8_t* wbox, uint32_t t_addr) {
  const uint32_t w_addr = smem_u32(wbox);
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) wgmma_fp8<kNt>(acc, make_desc(w_addr + 32 * ks), make_desc(t_addr + 32 * ks), ks);
}

// The promotion of one box's k block (its products complete in tmp): fin += tmp * (weight scale
// of the row * token scale of the column) in fp32. wsc: the box's 64 weight-row scales; xsc: the
// token rows' scales (4-byte aligned only: where the unit's first row fell in its bulk copy).
template <int kNt>
__device__ __forceinline__ void promote_box(const float (&tmp)[kNt / 2], float (&fin)[kNt / 2], const float* wsc,
                                            const float* xsc, int w, int g8, int q) {
  float wsv[2], xsv[kNt / 8][2];
#pragma unroll
  for (int r = 0; r < 2; ++r) wsv[r] = wsc[16 * w + g8 + 8 * r];
#pragma unroll
  for (int j = 0; j < kNt / 8; ++j) {
    xsv[j][0] = xsc[8 * j + 2 * q];
    xsv[j][1] = xsc[8 * j + 2 * q + 1];
  }
#pragma unroll
  for (int j = 0; j < kNt / 8; ++j)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int i2 = 0; i2 < 2; ++i2) {
        const int k = 4 * j + 2 * r + i2;
        fin[k] = fmaf(tmp[k], wsv[r] * xsv[j][i2], fin[k]);
      }
}

// One k block of the warpgroup's two 64-row weight boxes (`wbox`, `wbox` + kBox) times the token
// rows (`tbox`): the products into tmp (both boxes' before one wait), then the promotion. wsc:
// the two boxes' 128 weight-row scales; xsc: the token rows' scales.
template <int kNt>
__device__ __forceinline__ void stream_product(float (&tmp)[2][kNt / 2], float (&fin)[2][kNt / 2], const uint8_t* wbox,
                                               const uint8_t* tbox, const float* wsc, const float* xsc, int w, int g8,
                                               int q) {
  const uint32_t t_addr = smem_u32(tbox);
  wgmma_fence();
#pragma unroll
  for (int b = 0; b < 2; ++b) box_product<kNt>(tmp[b], wbox + b * kBox, t_addr);
  wgmma_commit();
  wgmma_wait_all();
  fence_acc(tmp[0]);
  fence_acc(tmp[1]);
#pragma unroll
  for (int b = 0; b < 2; ++b) promote_box<kNt>(tmp[b], fin[b], wsc + 64 * b, xsc, w, g8, q);
}

// The producer's position: work unit, its k range and stage, and what the unit's copies need.
struct Cursor {
  int64_t i;
  Unit u;
  int kb, kb1;
  const CUtensorMap* wm;  // the expert's weight map
  int wrow[4];            // each 64-row box's first weight row
  // Tiled: the unit's row block's weight-row scales (k block 0). Row-major: the expert's; the
  // lane's rows (lane + 32 j, j < 8): offsets into them (k block 0), and which rows exist.
  const float* ws;
  int soff[8];
  uint32_t smask;
  const float* as;  // the token rows' scales of k block 0, from the 16-byte boundary
  uint32_t abytes;  // a k block's token-row scale bytes
  uint32_t kbytes;  // a k block's bytes in the stage's count: weights, token rows, bulk-copied scales
};

template <bool kGateUp, int kNt>
__global__ void __launch_bounds__(kThreads, 1) stream_kernel(const __grid_constant__ CUtensorMap amap, const GemmArgs g) {
  using G = Geo<kNt>;
  const int kp = g.kp, stride = G::stride(kp), S = G::stages(kp);
  extern __shared__ uint8_t stream_smem_raw[];
  uint8_t* const ring = align1024(stream_smem_raw);
  uint64_t* const full = reinterpret_cast<uint64_t*>(ring + kRingBytes);
  uint64_t* const empty = full + kMaxStages;
  float* const red = reinterpret_cast<float*>(empty + kMaxStages);  // [8 warps][kNt]
  int* const flag = reinterpret_cast<int*>(red + 8 * kNt);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  // A stage: [kp][256 weight rows] boxes, [kp][token rows] boxes, then the scales.
  const int tok_off = kp * kWBytes, sc_off = kp * G::kStageK;
  // Who brings the weight rows' scales: lane 0's bulk copy (tiled), the 32 lanes' cp.async
  // (row-major), or nobody (timing experiment 1).
  const bool w_bulk = g.wtiled && g.experiment < 1, w_lanes = !g.wtiled && g.experiment < 1;
  // The scale slots start at zero: the token rows' bulk copies leave the slots past their runs as
  // they were (read, and masked, for the unit's absent columns), and timing experiment 1 never
  // writes the weight rows'; zeros keep those products finite.
  for (int idx = tid; idx < S * kp * G::kScales; idx += kThreads) {
    const int st = idx / (kp * G::kScales);
    reinterpret_cast<float*>(ring + st * stride + sc_off)[idx - st * kp * G::kScales] = 0.0f;
  }
  fence_proxy_async();  // before the bulk copies (async proxy) write the same slots
  if (tid == 0) {
    for (int s = 0; s < S; ++s) {
      mbar_init(&full[s], w_lanes ? 33 : 1);  // lane 0's expect_tx (and the 32 lanes' scale copies)
      mbar_init(&empty[s], 8);
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();
  pdl_trigger();
  // The k split: the host's, or picked here from the row blocks the sort found (the same in
  // every CTA). Not at 64 token rows (the host never asks there): the two live values made the
  // gate_up kernel spill.
  int ksplit = g.ksplit, cols = g.cols;
  if (kNt <= 32 && g.ksplit_max > 0) {
    ksplit = pick_ksplit(int64_t(g.blk_start[g.E]) * g.cols, g.nkb, int(gridDim.x), g.ksplit_max);
    cols = g.cols * ksplit;
  }
  const int64_t total = int64_t(g.blk_start[g.E]) * cols;

  if (warp < 4) {
    if (warp != 0) {
      pdl_wait();
      return;
    }
    // Producer.
    const uint64_t policy = l2_policy_evict_first();
    int s = 0;
    uint32_t ep = 1;
    const CUtensorMap* acquired = nullptr;
    auto begin = [&](Cursor& c, int64_t i) {
      c.i = i;
      if (i >= total) return;
      c.u = unit_of(g, i, kNt, cols, ksplit);
      split_range(c.u.ks, ksplit, g.nkb, c.kb, c.kb1);
      c.wm = g.wmaps + c.u.e;
#pragma unroll
      for (int b = 0; b < 4; ++b) {
        bool unused;
        c.wrow[b] = weight_row<kGateUp>(g, c.u.rb, b * 64, unused);
      }
      const int shift = c.u.r0 & 3;  // rows_cap % 4 == 0: the run starts 16-byte aligned
      c.as = g.a_scale + (c.u.r0 - shift);
      c.abytes = uint32_t((shift + c.u.rows + 3) / 4 * 16);
      c.kbytes = uint32_t(G::kStageK) + (w_bulk ? uint32_t(kW * 4) : 0u) + c.abytes;
      c.smask = 0;
      if (g.wtiled) {
        c.ws = g.wscale[c.u.e] + int64_t(c.u.rb) * g.nkb * kW;
        return;
      }
      c.ws = g.wscale[c.u.e];
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        bool ok;
        const int n = weight_row<kGateUp>(g, c.u.rb, lane + 32 * j, ok);
        c.soff[j] = ok ? (n / g.sbr) * g.nkb : 0;
        c.smask |= uint32_t(ok) << j;
      }
    };
    auto advance = [&](Cursor& c) {
      c.kb += kp;
      if (c.kb >= c.kb1) begin(c, c.i + gridDim.x);
    };
    // A stage's weights and weight-row scales (lane 0: TMA and bulk copy, expecting the whole
    // stage's bytes; row-major scales: the lanes' cp.async, then their arrivals).
    auto load_weights = [&](const Cursor& c, int st) {
      const int nk = min(kp, c.kb1 - c.kb);
      uint8_t* base = ring + st * stride;
      float* sc = reinterpret_cast<float*>(base + sc_off);
      if (lane == 0) {
        if (c.wm != acquired) {
          tensormap_acquire(c.wm);
          acquired = c.wm;
        }
        mbar_expect_tx(&full[st], uint32_t(nk) * c.kbytes);
        for (int ii = 0; ii < nk; ++ii)
#pragma unroll
          for (int b = 0; b < 4; ++b)
            tma_load_hint(base + ii * kWBytes + b * kBox, c.wm, (c.kb + ii) * kBK, c.wrow[b], &full[st], policy);
        if (w_bulk) bulk_copy(sc, c.ws + int64_t(c.kb) * kW, uint32_t(nk) * kW * 4, &full[st]);
      }
      if (!w_lanes) return;
      // The unit's rows were found once (begin): a scale is one add from its row's offset. (Finding
      // each scale's row for every stage made the producer the kernels' pace: 32 tokens took 524
      // instead of 418 us at one TP4 rank; docs/performance.md.)
      for (int ii = 0; ii < kp; ++ii)
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const bool ok = (c.smask >> j & 1u) && ii < nk;
          cp_async4(&sc[ii * kW + lane + 32 * j], c.ws + (ok ? c.soff[j] + c.kb + ii : 0), ok);
        }
      cp_async_arrive(&full[st]);
    };
    // A stage's token rows and their scales (lane 0; in the stage's bytes).
    auto load_tokens = [&](const Cursor& c, int st) {
      if (lane != 0) return;
      const int nk = min(kp, c.kb1 - c.kb);
      uint8_t* base = ring + st * stride;
      float* tsc = reinterpret_cast<float*>(base + sc_off) + kp * kW;
      for (int ii = 0; ii < nk; ++ii) {
        tma_load(base + tok_off + ii * G::kTokBox, &amap, (c.kb + ii) * kBK, c.u.r0, &full[st]);
        bulk_copy(tsc + ii * G::kTs, c.as + int64_t(c.kb + ii) * g.rows_cap, c.abytes, &full[st]);
      }
    };
    // The first stages' weights before the wait for the previous kernel, their token rows after.
    Cursor c;
    begin(c, blockIdx.x);
    Cursor pre = c;
    int n_pre = 0;
    for (; n_pre < S && pre.i < total; ++n_pre, advance(pre)) load_weights(pre, n_pre);
    pdl_wait();
    for (int k = 0; k < n_pre; ++k, advance(c)) load_tokens(c, k);
    s = n_pre % S;
    ep = n_pre == S ? 0 : 1;
    for (; c.i < total; advance(c)) {
      mbar_wait(&empty[s], ep);
      load_weights(c, s);
      load_tokens(c, s);
      if (++s == S) s = 0, ep ^= 1;
    }
    return;
  }

  // Consumers: warpgroup cw holds weight rows 128 cw + 64 b + 16 w + g8 + 8 r (b, r < 2) and
  // token columns 8 j + 2 q + ii.
  pdl_wait();
  const int ctid = tid - 128, cw = ctid >> 7, w = (ctid >> 5) & 3, g8 = lane >> 2, q = lane & 3;
  constexpr int kAcc = kNt / 2;
  int s = 0;
  uint32_t fp = 0;
  float tmp[2][kAcc];
#pragma unroll
  for (int b = 0; b < 2; ++b)
#pragma unroll
    for (int k = 0; k < kAcc; ++k) tmp[b][k] = 0.0f;
  for (int64_t i = blockIdx.x; i < total; i += gridDim.x) {
    const Unit u = unit_of(g, i, kNt, cols, ksplit);
    const int xshift = u.r0 & 3;  // the unit's first token-row scale in its k block's run
    int kb0, kb1;
    split_range(u.ks, ksplit, g.nkb, kb0, kb1);
    float fin[2][kAcc];
#pragma unroll
    for (int b = 0; b < 2; ++b)
#pragma unroll
      for (int k = 0; k < kAcc; ++k) fin[b][k] = 0.0f;
    for (int kb = kb0; kb < kb1; kb += kp) {
      mbar_wait(&full[s], fp);
      const uint8_t* base = ring + s * stride;
      const float* sc = reinterpret_cast<const float*>(base + sc_off);
      const int nk = min(kp, kb1 - kb);
      if (g.experiment < 2)  // timing experiment 2: no products
        for (int ii = 0; ii < nk; ++ii)
          stream_product<kNt>(tmp, fin, base + ii * kWBytes + 2 * cw * kBox, base + tok_off + ii * G::kTokBox,
                              sc + ii * kW + 128 * cw, sc + kp * kW + ii * G::kTs + xshift, w, g8, q);
      __syncwarp();
      if (lane == 0) mbar_arrive(&empty[s]);
      if (++s == S) s = 0, fp ^= 1;
    }

    if (ksplit > 1) {
      // Partial sums in; the last split of the row block sums them in split order.
      float4* mine = reinterpret_cast<float4*>(g.partial + ((u.pe * ksplit + u.ks) * 256 + ctid) * kNt);
#pragma unroll
      for (int k = 0; k < kAcc / 4; ++k) {
        mine[k] = make_float4(fin[0][4 * k], fin[0][4 * k + 1], fin[0][4 * k + 2], fin[0][4 * k + 3]);
        mine[kAcc / 4 + k] = make_float4(fin[1][4 * k], fin[1][4 * k + 1], fin[1][4 * k + 2], fin[1][4 * k + 3]);
      }
      __threadfence();
      named_sync(1, 256);
      if (ctid == 0) {
        const int old = atomicAdd(&g.counters[u.pe], 1);
        *flag = old == ksplit - 1;
        if (old == ksplit - 1) g.counters[u.pe] = 0;  // every split has counted: back to zero for the next call
      }
      named_sync(1, 256);
      if (!*flag) continue;
      __threadfence();
#pragma unroll
      for (int b = 0; b < 2; ++b)
#pragma unroll
        for (int k = 0; k < kAcc; ++k) fin[b][k] = 0.0f;
      for (int k2 = 0; k2 < ksplit; ++k2) {
        const float4* src = reinterpret_cast<const float4*>(g.partial + ((u.pe * ksplit + k2) * 256 + ctid) * kNt);
#pragma unroll
        for (int k = 0; k < kAcc / 4; ++k) {
          const float4 a = __ldcg(src + k), b = __ldcg(src + kAcc / 4 + k);
          fin[0][4 * k] += a.x, fin[0][4 * k + 1] += a.y, fin[0][4 * k + 2] += a.z, fin[0][4 * k + 3] += a.w;
          fin[1][4 * k] += b.x, fin[1][4 * k + 1] += b.y, fin[1][4 * k + 2] += b.z, fin[1][4 * k + 3] += b.w;
        }
      }
    }

    if (kGateUp) {
      // SwiGLU of unit u0 + 64 cw + 16 w + g8 + 8 r for token column 8 j + 2 q + ii; each token's
      // amax over the 128 units: the thread's 2, the warp's 8 lanes of its quad lane q, 8 warps.
      float v[kNt / 8][2][2];
      float amax[kNt / 8][2];
#pragma unroll
      for (int j = 0; j < kNt / 8; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          amax[j][ii] = 0.0f;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int unit = u.rb * 128 + 64 * cw + 16 * w + g8 + 8 * r;
            const int k = 4 * j + 2 * r + ii;
            const float x = swiglu_oai_value(fin[0][k], fin[1][k], g.alpha, g.limit, g.beta);
            v[j][r][ii] = unit < g.inter ? x : 0.0f;
            amax[j][ii] = fmaxf(amax[j][ii], fabsf(v[j][r][ii]));
          }
#pragma unroll
          for (int o = 4; o < 32; o <<= 1) amax[j][ii] = fmaxf(amax[j][ii], __shfl_xor_sync(0xffffffffu, amax[j][ii], o));
          if (g8 == 0) red[(4 * cw + w) * kNt + 8 * j + 2 * q + ii] = amax[j][ii];
        }
      named_sync(1, 256);
#pragma unroll
      for (int j = 0; j < kNt / 8; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          float m = 0.0f;
#pragma unroll
          for (int k = 0; k < 8; ++k) m = fmaxf(m, red[k * kNt + 8 * j + 2 * q + ii]);
          amax[j][ii] = m;
        }
      named_sync(1, 256);  // red is free for the next unit
#pragma unroll
      for (int j = 0; j < kNt / 8; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const int col = 8 * j + 2 * q + ii;
          if (col >= u.rows) continue;
          const float scale = group_scale(amax[j][ii]);
          uint8_t* dst = g.act_q + int64_t(u.r0 + col) * g.ld_act;
#pragma unroll
          for (int r = 0; r < 2; ++r) {
            const int unit = u.rb * 128 + 64 * cw + 16 * w + g8 + 8 * r;
            if (unit < g.inter) dst[unit] = quant(v[j][r][ii], scale);
          }
          if (ctid < 4) g.act_scale[int64_t(u.rb) * g.rows_cap + u.r0 + col] = scale;
        }
    } else {
#pragma unroll
      for (int j = 0; j < kNt / 8; ++j)
#pragma unroll
        for (int ii = 0; ii < 2; ++ii) {
          const int col = 8 * j + 2 * q + ii;
          if (col >= u.rows) continue;
          uint16_t* dst = g.y + int64_t(g.sorted[u.r0 + col]) * g.hidden;
#pragma unroll
          for (int b = 0; b < 2; ++b)
#pragma unroll
            for (int r = 0; r < 2; ++r) {
              const int n = u.rb * kW + 128 * cw + 64 * b + 16 * w + g8 + 8 * r;
              if (n < g.hidden) dst[n] = f32_to_bf16_bits(fin[b][4 * j + 2 * r + ii]);
            }
        }
    }
  }
}

template <bool kGateUp, int kNt>
void launch_one(const CUtensorMap& amap, const GemmArgs& g, int grid, bool pdl, cudaStream_t st) {
  auto kernel = stream_kernel<kGateUp, kNt>;
  set_smem(kernel, Geo<kNt>::kBytes);
  launch_pdl(pdl, kernel, dim3(unsigned(grid)), dim3(kThreads), Geo<kNt>::kBytes, st,
             kGateUp ? "moe_experts fp8 (gate_up stream)" : "moe_experts fp8 (down stream)", amap, g);
}

}  // namespace

size_t stream_smem_bytes(int nt) {
  switch (nt) {
    case 8: return Geo<8>::kBytes;
    case 16: return Geo<16>::kBytes;
    case 32: return Geo<32>::kBytes;
    default: return Geo<64>::kBytes;
  }
}

void launch_stream(bool gate_up, int nt, const CUtensorMap& amap, const GemmArgs& g, int grid, bool pdl,
                   cudaStream_t st) {
  SIEVE_CHECK(g.kp >= 1 && g.kp <= kMaxKp, "moe_experts fp8: k blocks a stream stage");
  SIEVE_CHECK(!g.wtiled || g.sbr == 1, "moe_experts fp8: tiled scales need (1, 128) blocks");
  // The token rows' scales are bulk-copied in 16-byte runs of k-block-major rows.
  SIEVE_CHECK(g.rows_cap % 4 == 0, "moe_experts fp8: the stream kernels need rows_cap % 4");
  switch (nt * 2 + (gate_up ? 1 : 0)) {
    case 17: launch_one<true, 8>(amap, g, grid, pdl, st); break;
    case 16: launch_one<false, 8>(amap, g, grid, pdl, st); break;
    case 33: launch_one<true, 16>(amap, g, grid, pdl, st); break;
    case 32: launch_one<false, 16>(amap, g, grid, pdl, st); break;
    case 65: launch_one<true, 32>(amap, g, grid, pdl, st); break;
    case 64: launch_one<false, 32>(amap, g, grid, pdl, st); break;
    case 129: launch_one<true, 64>(amap, g, grid, pdl, st); break;
    default: launch_one<false, 64>(amap, g, grid, pdl, st); break;
  }
}

}  // namespace sieve::cuda::moe_fp8
