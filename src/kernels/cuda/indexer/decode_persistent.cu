// Decode lightning indexer, persistent kernel (v4 in docs/performance.md). Same contract,
// supported set and outputs as the chunked kernel (decode_chunked.cu, "v2" below) (block scores and top-k ids bitwise v2's: the same
// MMA over the query vectors of a request — 16-row, or narrow with at most 8 vectors
// (indexer_narrow) — the same per-block maxima, the same "higher score, then lower block id"
// order). What changes is how work is handed out and where the
// top-k is taken.
//
// v2 / v3 give each CTA a fixed chunk of one request, rank the chunk, and merge the chunk lists
// per request at the end: every request finishes at the very end of the grid, the merge is a
// serial tail (fence, counter, list loads, ranking) after the slowest CTA's data, and a CTA
// whose copies are served late holds up its request (traces: 6.6 us between the median and the
// last CTA at b32 ctx9216). v4:
//  - Work units: U consecutive key blocks of one request (unit u: request u / UPR, blocks
//    (u % UPR) * U ..). Units are numbered request-major. A persistent grid of P CTAs (what
//    is resident at once, from the occupancy query) takes its static units blockIdx.x + r * P
//    (r < R, enough to fill its ring) first, then the next live unit (one with blocks) from a
//    global counter, so a CTA whose copies are slow simply takes fewer units, and requests
//    finish one after another instead of all at the end. When the batch fits, U is the
//    smallest unit (<= 32 blocks) that gives each CTA at most one unit, R = 1 and nothing is
//    claimed. Grid, U and P come from shapes only (max_seq_len, num_seqs, SM count); units
//    past a request's live length are skipped, so a graph captured at max_model_len replays at
//    any live length.
//  - CTA = 8 consumer warps (v2's scoring loop, 16 keys of every block each), a producer warp
//    and a finisher warp. The producer claims units two ahead (atomic counter), loads the next
//    two units' lengths and block-table entries while it issues the current one, copies the unit's query vectors into a
//    unit slot (bulk copy; plain loads when the rows are not 16-byte aligned) and each key
//    block into a stage of the ring (cp.async.bulk on an mbarrier), with a small record per
//    stage (slot, block of the unit, last block of the unit).
//  - Consumers take stages in order; at a unit's first block they build the query fragments
//    from the slot; per block they fold the per-row masked maximum into the slot's [16][U]
//    table (order-preserving integer atomicMax, as v2) and after the unit's last block each
//    thread arrives on the slot's "done" barrier.
//  - The finisher forms the unit's block scores (forced sentinels, -inf past a row's own
//    blocks) into the request's global score rows (block_scores when the caller asks for them,
//    else the workspace), returns the slot to the producer, and adds the unit's blocks to the
//    request's counter. The finisher that completes a request selects each row's top-k from
//    its full score row (select_row: lane bests -> threshold -> candidate ranking, one warp a
//    row) and returns the counter to zero. Only the last request's selection is left after the
//    last data; every other selection overlaps the streaming of later units.
//  - Polled finish (kPoll: every CTA of the grid is resident at once, as the planner sizes it;
//    used where every unit is static, and with claimed units under the long-context plan, where
//    a polling finisher waits only for units numbered below its own: planner.cu): no fence and
//    no counter. Each finisher stores its rows' scores as order keys (never 0) into
//    a zeroed private scratch [rows][max_blocks rounded to 4] with relaxed stores, and the
//    finisher of the unit holding the request's last block copies each row from there into
//    shared memory (cp.async through L2, again for any chunk with a word still 0), selects, and
//    returns the row to zero. Only the blocks a row's selection reads are stored, so every
//    stored word is read and cleared in the same call. IndexerTuning::persistent_poll false: the
//    counter finish.
//  - With claims, the last CTA to exit returns the unit counter to zero (graph replays need no
//    memset). When every unit is static (one unit per CTA: the usual plan) the producer neither
//    claims nor sums the requests' units, and the CTAs skip the exit counter.
// PDL (common.cuh): the producer reads the metadata and copies blocks older than the request's
// new tokens of its first unit before pdl_wait; the unit counter, q and every later copy after.
// Without PDL, with fp8 units of 2..8 blocks, the first unit's query rows are copied before its
// key blocks (see the planner, plan_persistent in planner.cu).
// IndexerTuning::trace prints per-CTA phase times; its persistent_* fields force the unit size,
// the ring depth, the grid and the CTAs per SM.
#include <algorithm>
#include <cstdio>
#include <map>
#include <mutex>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/indexer/kernels.cuh"
#include "kernels/cuda/internal.h"

namespace sieve::cuda {

namespace {

constexpr int kBlock = 128;
constexpr int kDim = 128;
constexpr int kConsumerWarps = 8;
constexpr int kProducerWarp = kConsumerWarps;  // then the finisher warp
constexpr int kThreads = (kConsumerWarps + 2) * 32;
constexpr int kMetaInts = kPersistentMetaInts;
constexpr int kMaxStatic = kPersistentMaxStatic;

// Trace points per CTA (IndexerTuning::trace) (%globaltimer ns): start, first block in, consumers done,
// finisher done, end, and (a selecting finisher) its last request counted and selected, the
// first unit's query rows in, the first block's maxima folded (these two only in a build with
// -DSIEVE_V4_TRACE_DETAIL: the extra code changes the register allocation of the fp8 kernel); then
// the units this CTA scored, the requests it selected, and its SM + 1.
constexpr int kTracePoints = 9;
constexpr int kTraceSlots = kTracePoints + 3;

__device__ __forceinline__ void mbar_arrive_count(uint64_t* bar, int count) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Query fragments of rows g and g + 8 from a unit slot holding the request's nv query vectors
// as raw rows of 128 elements (bf16 or f32), in v2's permuted k-slot -> dim mapping.
template <bool kFp8>
__device__ __forceinline__ void q_frags_from_slot(const IndexerArgs& a, const uint8_t* qs, int nv, int g, int q,
                                                  uint32_t (&qa)[8][4]) {
#pragma unroll
  for (int st = 0; st < 8; ++st) {
    const int d = dbase<kFp8>(st, q);
    float x[2][4];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int v = g + 8 * r;
#pragma unroll
      for (int i = 0; i < 4; ++i) x[r][i] = 0.f;
      if (v < nv) {
        if (a.q_bf16) unpack_bf16x4(*reinterpret_cast<const uint2*>(qs + (v * kDim + d) * 2), x[r]);
        else unpack_f32x4(*reinterpret_cast<const float4*>(qs + (v * kDim + d) * 4), x[r]);
        if (a.q_fp8_round) {
#pragma unroll
          for (int i = 0; i < 4; ++i) x[r][i] = fp8_to_f32(f32_to_fp8_bits(x[r][i]));
        }
      }
    }
    qa[st][0] = pack_op<kFp8>(x[0][0], x[0][1]);
    qa[st][1] = pack_op<kFp8>(x[1][0], x[1][1]);
    qa[st][2] = pack_op<kFp8>(x[0][2], x[0][3]);
    qa[st][3] = pack_op<kFp8>(x[1][2], x[1][3]);
  }
}

// What the producer knows of a unit: lanes 0, 1, 2 hold query_start_loc[s], [s + 1], seq_lens[s]
// in `meta`; lane j < U the physical id of the unit's block j in `phys`.
// Key blocks of a request (clamped to the units' range) and of its unit starting at block b0.
__device__ __forceinline__ int request_blocks(const IndexerArgs& a, int qlen, int seq_len) {
  return qlen > 0 ? min((seq_len - 1) / kBlock + 1, a.max_blocks) : 0;
}
__device__ __forceinline__ int unit_blocks(const IndexerArgs& a, int b0, int qlen, int seq_len) {
  return max(0, min(a.unit, request_blocks(a, qlen, seq_len) - b0));
}

struct UnitLoad {
  int u, s, b0, meta, phys;
};
__device__ __forceinline__ UnitLoad load_unit(const IndexerArgs& a, int u, int lane) {
  UnitLoad r{u, 0, 0, 0, 0};
  if (u < 0) return r;
  r.s = u / a.upr;
  r.b0 = (u - r.s * a.upr) * a.unit;
  if (lane < 2) r.meta = __ldg(a.qsl + r.s + lane);
  else if (lane == 2) r.meta = __ldg(a.seq_lens + r.s);
  if (lane < a.unit && r.b0 + lane < a.max_blocks) r.phys = __ldg(a.block_tables + int64_t(r.s) * a.mbps + r.b0 + lane);
  return r;
}

// A unit's request (all lanes; from the lanes that loaded it): first token, query rows, length,
// and the unit's blocks under the length.
struct UnitInfo {
  int tok0, qlen, seq_len, nb;
};
__device__ __forceinline__ UnitInfo unit_info(const IndexerArgs& a, const UnitLoad& w) {
  UnitInfo r;
  r.tok0 = __shfl_sync(0xffffffffu, w.meta, 0);
  r.qlen = __shfl_sync(0xffffffffu, w.meta, 1) - r.tok0;
  r.seq_len = __shfl_sync(0xffffffffu, w.meta, 2);
  r.nb = unit_blocks(a, w.b0, r.qlen, r.seq_len);
  return r;
}

// kPoll: the CTA of a request's last block polls the others' scores (IndexerArgs::rec).
template <bool kFp8, int kMinCtas, bool kPoll, bool kNarrow>
__global__ void __launch_bounds__(kThreads, kMinCtas) decode_persistent_kernel(IndexerArgs a) {
  extern __shared__ __align__(128) uint8_t smem[];
  constexpr int row_bytes = kFp8 ? kDim : kDim * 2;
  constexpr uint32_t block_bytes = uint32_t(kBlock) * row_bytes;
  const int NS = a.stages, SL = a.slots, U = a.unit, K = a.topk;
  const PersistentLayout L = persistent_layout(NS, SL, U, a.q_slot_bytes, a.max_blocks, a.num_seqs, block_bytes);
  uint8_t* stage = smem;
  uint8_t* qslot = smem + L.q;
  int* mx = reinterpret_cast<int*>(smem + L.mx);          // [slots][16][U] encoded maxima
  int* umeta = reinterpret_cast<int*>(smem + L.umeta);    // [slots][kMetaInts]
  int* smeta = reinterpret_cast<int*>(smem + L.smeta);    // [stages]: slot | j << 8 | last << 16; -1 end
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + L.bars);
  uint64_t* empty = full + NS;
  uint64_t* qfull = empty + NS;   // the slot's query rows have landed (producer)
  uint64_t* udone = qfull + SL;   // every consumer thread is done with the slot's unit
  uint64_t* ufree = udone + SL;   // the finisher is done with the slot
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  unsigned long long* const tr = a.trace ? a.trace + int64_t(blockIdx.x) * kTraceSlots : nullptr;
  pdl_trigger();
  if (tr && threadIdx.x == 0) {
    tr[0] = global_ns();
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    tr[kTracePoints + 2] = sm + 1ull;
  }
  // The static units' metadata and block-table entries (units blockIdx.x + r * P, r < R: R * U
  // blocks fill the ring at the start), in flight while the barriers are set up.
  const int P = int(gridDim.x), R = a.static_units;
  // Every unit static (one unit per CTA, the usual plan): no claims, no prefix sum over the
  // requests, and no exit counter (the unit counter is never touched, so it stays zero).
  const bool claims = int64_t(R) * P < a.dense_units;
  UnitLoad stat[kMaxStatic];
  if (warp == kProducerWarp) {
#pragma unroll
    for (int r = 0; r < kMaxStatic; ++r) {
      const int u = int(blockIdx.x) + r * P;
      stat[r] = load_unit(a, r < R && u < a.dense_units ? u : -1, lane);
    }
  }
  if (threadIdx.x == 0) {
    for (int i = 0; i < NS; ++i) {
      mbar_init(&full[i], 1);
      mbar_init(&empty[i], kConsumerWarps * 32);  // every consumer thread releases its own reads
    }
    for (int i = 0; i < SL; ++i) {
      mbar_init(&qfull[i], 32);  // every producer lane, after its query writes (or copies)
      mbar_init(&udone[i], kConsumerWarps * 32);  // every consumer thread, after its last block
      mbar_init(&ufree[i], 32);                   // every finisher lane, after its reads
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  for (int e = threadIdx.x; e < SL * 16 * U; e += kThreads) mx[e] = enc_max(kNegInf);
  __syncthreads();

  if (warp == kProducerWarp) {
    // ------------------------------------------------------------------ producer
    const size_t esz = a.q_bf16 ? 2 : 4;
    const uint32_t row_b = uint32_t(a.H * kDim * esz);  // one token's query vectors
    int k = 0;  // units given to the consumers
    int i = 0;  // stages filled
    // Lane 0: copies block j of a unit of nb blocks, physical id ph, into stage st with its
    // record (the unit's slot, j, last-block flag).
    const uint64_t pol = a.l2_first ? l2_policy_evict_first() : 0;
    auto copy_block = [&](int st, int slot, int j, int nb, int ph) {
      smeta[st] = slot | (j << 8) | (j == nb - 1 ? 1 << 16 : 0);
      bulk_load_policy(stage + st * block_bytes, a.cache + int64_t(ph) * block_bytes, block_bytes, &full[st], a.l2_first,
                       pol);
    };
    // Gives unit w to the consumers: its record and query rows into the next slot, then its key
    // blocks from `pre` on into the ring (blocks 0 .. pre - 1 already copied into stages
    // i - pre .. i - 1). Empty units (past the request's length) take no slot.
    auto issue_unit = [&](const UnitLoad& w, int pre) {
      if (w.u < 0) return;
      const UnitInfo ui = unit_info(a, w);
      const int tok0 = ui.tok0, qlen = ui.qlen, seq_len = ui.seq_len, nb = ui.nb;
      if (nb == 0) return;
      const int nv = min(16, max(0, qlen * a.H));
      const int slot = k % SL;
      mbar_wait(&ufree[slot], uint32_t((k / SL) & 1) ^ 1u);  // every lane: its writes below follow
      int* um = umeta + slot * kMetaInts;
      uint8_t* qs = qslot + size_t(slot) * a.q_slot_bytes;
      if (lane == 0) {
        um[0] = w.s, um[1] = w.b0, um[2] = nb, um[3] = tok0, um[4] = qlen, um[5] = seq_len, um[6] = nv;
      }
      if (a.q_rows16) {
        const int rows = min(qlen, int(a.q_slot_bytes / row_b));
        if (lane == 0) mbar_expect_tx(&qfull[slot], uint32_t(rows) * row_b);
        else mbar_arrive(&qfull[slot]);
        __syncwarp();
        if (lane < rows)
          bulk_copy(qs + lane * row_b,
                    static_cast<const uint8_t*>(a.q) + (int64_t(tok0) + lane) * a.q_stride * int64_t(esz), row_b,
                    &qfull[slot]);
      } else {
        for (int e = lane; e < nv * kDim; e += 32) {
          const int v = e / kDim, d = e % kDim;
          const int64_t src = int64_t(tok0 + v / a.H) * a.q_stride + int64_t(v % a.H) * kDim + d;
          if (a.q_bf16) {
            reinterpret_cast<uint16_t*>(qs)[e] = static_cast<const uint16_t*>(a.q)[src];
          } else {
            reinterpret_cast<float*>(qs)[e] = static_cast<const float*>(a.q)[src];
          }
        }
        mbar_arrive(&qfull[slot]);  // each lane for its own writes (and lane 0's record)
      }
      for (int j = pre; j < nb; ++j) {
        const int ph = __shfl_sync(0xffffffffu, w.phys, j);
        if (lane == 0) {
          const int st = i % NS;
          mbar_wait(&empty[st], uint32_t((i / NS) & 1) ^ 1u);
          copy_block(st, slot, j, nb, ph);
        }
        ++i;
      }
      ++k;
    };

    // The static units first. With early_copies (always under PDL), the first one's blocks
    // older than the request's new tokens are copied before pdl_wait (the query rows come from
    // the kernel before and wait for it). Otherwise the query rows go first: a copy issued after
    // the ring's key blocks is served behind them under load (traces at b32 ctx9216 fp8: query
    // rows in 2 us after the first block), and no consumer can start before it.
    int pre = 0;
    if (stat[0].u >= 0 && a.early_copies) {
      const UnitInfo ui = unit_info(a, stat[0]);
      const int n_old = ui.qlen > 0 ? (ui.seq_len - ui.qlen) / kBlock : 0;
      while (pre < ui.nb && pre < NS && stat[0].b0 + pre < n_old) {
        const int ph = __shfl_sync(0xffffffffu, stat[0].phys, pre);
        if (lane == 0) copy_block(pre, 0, pre, ui.nb, ph);  // the first unit takes slot 0
        ++pre;
      }
      i = pre;
    }
    pdl_wait();
    int c = 0;  // claim of the first dynamic unit
    if (claims && lane == 0) c = atomicAdd(a.work, 1);
#pragma unroll
    for (int r = 0; r < kMaxStatic; ++r) issue_unit(stat[r], r == 0 ? pre : 0);

    if (claims) {
      // Dynamic units: claims count the live units (those with blocks) past the static ones, in
      // unit order. cum[s] = live units of requests before s; l0 = live units that are static.
      int* cum = reinterpret_cast<int*>(smem + L.cum);
      int run = 0, l0 = 0;
      const int static_end = R * P;
      for (int base = 0; base < a.num_seqs; base += 32) {
        const int s = base + lane;
        int nu = 0, in_static = 0;
        if (s < a.num_seqs) {
          const int t0 = __ldg(a.qsl + s), t1 = __ldg(a.qsl + s + 1), sl = __ldg(a.seq_lens + s);
          nu = (request_blocks(a, t1 - t0, sl) + a.unit - 1) / a.unit;
          in_static = min(nu, max(0, static_end - s * a.upr));
        }
        int x = nu;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
          const int y = __shfl_up_sync(0xffffffffu, x, o);
          if (lane >= o) x += y;
        }
        if (s < a.num_seqs) cum[s + 1] = run + x;
        run += __shfl_sync(0xffffffffu, x, 31);
        l0 += __reduce_add_sync(0xffffffffu, in_static);
      }
      if (lane == 0) cum[0] = 0;
      __syncwarp();
      const int live = run;
      // Unit index (dense numbering) of live unit number n, or -1 past the last.
      auto resolve = [&](int n) {
        if (n >= live) return -1;
        int lo = 0, hi = a.num_seqs - 1;
        while (lo < hi) {
          const int mid = (lo + hi + 1) >> 1;
          if (cum[mid] <= n) lo = mid;
          else hi = mid - 1;
        }
        return lo * a.upr + (n - cum[lo]);
      };
      // Two units of lookahead: the next two units' metadata loads are in flight and the claims of
      // the two after them, so neither the counter's nor the metadata's round trip stalls the
      // copies (claims past the end are harmless: the counter is reset at exit). c < 0: no claim.
      auto claim = [&]() {
        int v = 0;
        if (lane == 0) v = atomicAdd(a.work, 1);
        return v;
      };
      auto next_unit = [&](int cv) { return cv < 0 ? -1 : resolve(l0 + __shfl_sync(0xffffffffu, cv, 0)); };
      int n1 = next_unit(c);
      UnitLoad i1 = load_unit(a, n1, lane);
      int c1 = n1 >= 0 ? claim() : -1;
      const int n2 = next_unit(c1);
      UnitLoad i2 = load_unit(a, n2, lane);
      c1 = n2 >= 0 ? claim() : -1;
      int c2 = n2 >= 0 ? claim() : -1;
      while (i1.u >= 0) {
        const UnitLoad cur = i1;
        i1 = i2;
        const int nn = next_unit(c1);
        i2 = load_unit(a, nn, lane);
        c1 = c2;
        c2 = nn >= 0 ? claim() : -1;
        issue_unit(cur, 0);
      }
    }
    // End of the work: a record without data for the consumers, an empty unit for the finisher.
    if (lane == 0) {
      const int st = i % NS;
      mbar_wait(&empty[st], uint32_t((i / NS) & 1) ^ 1u);
      smeta[st] = -1;
      mbar_arrive(&full[st]);
      const int slot = k % SL;
      mbar_wait(&ufree[slot], uint32_t((k / SL) & 1) ^ 1u);
      umeta[slot * kMetaInts] = -1;
      mbar_arrive_count(&udone[slot], kConsumerWarps * 32);
    }
    __syncwarp();
  } else if (warp < kConsumerWarps) {
    // ------------------------------------------------------------------ consumers
    pdl_wait();
    const int g = lane / 4, q = lane % 4;
    const int v0 = max_vec<kNarrow>(g, q, 0), v1 = max_vec<kNarrow>(g, q, 1);
    uint32_t qa[8][4];
    int k = -1, slot = 0, nv = 0, pos0 = 0, pos1 = 0, b0 = 0;
    int frag_s = -1;  // the request whose query fragments qa holds
    for (int i = 0;; ++i) {
      const int st = i % NS;
      mbar_wait(&full[st], uint32_t(i / NS) & 1u);
      const int m = smeta[st];
      if (m < 0) break;
      const int j = (m >> 8) & 0xff;
      if (tr && i == 0 && threadIdx.x == 0) tr[1] = global_ns();
      if (j == 0) {  // a new unit: its query fragments from the slot
        ++k;
        slot = m & 0xff;
        mbar_wait(&qfull[slot], uint32_t((k / SL) & 1));
#ifdef SIEVE_V4_TRACE_DETAIL
        if (tr && k == 0 && threadIdx.x == 0) tr[7] = global_ns();
#endif
        const int* um = umeta + slot * kMetaInts;
        b0 = um[1];
        const int qlen = um[4], seq_len = um[5];
        nv = um[6];
        pos0 = seq_len - qlen + v0 / a.H;
        pos1 = seq_len - qlen + v1 / a.H;
        // A CTA's claimed units are mostly of one request (units are claimed in order, P apart):
        // the fragments (32 conversions a lane) are rebuilt only when it changes. Only in the
        // fp8 two-CTA builds (the long-context plan's): elsewhere the extra register changed
        // the allocation (bf16 87 -> 88 and 88 -> 90 registers, the fp8 three-CTA spills).
        if (!(kFp8 && kMinCtas == 2) || um[0] != frag_s) {
          frag_s = um[0];
          q_frags_from_slot<kFp8>(a, qslot + size_t(slot) * a.q_slot_bytes, nv, g, q, qa);
        }
      }
      const uint8_t* base = stage + st * block_bytes + warp * 16 * row_bytes;
      KeyRegs<kFp8> kr[2];
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) kr[nt].load_smem(base + (nt * 8 + g) * row_bytes, q, g);
      mbar_arrive(&empty[st]);
      fold_warp_block<kFp8, kNarrow>(kr, qa, (b0 + j) * kBlock + warp * 16, g, q, pos0, pos1, nv,
                                     mx + slot * 16 * U + j, U);
#ifdef SIEVE_V4_TRACE_DETAIL
      if (tr && i == 0 && threadIdx.x == 0) tr[8] = global_ns();
#endif
      if (m & (1 << 16)) mbar_arrive(&udone[slot]);  // the unit's last block (after this thread's maxima)
    }
    if (tr) {
      asm volatile("bar.sync 1, %0;\n" ::"r"(kConsumerWarps * 32) : "memory");
      if (threadIdx.x == 0) tr[2] = global_ns();
    }
  } else {
    // ------------------------------------------------------------------ finisher
    pdl_wait();
    uint32_t* keys = reinterpret_cast<uint32_t*>(smem + L.keys);
    unsigned long long* cand = reinterpret_cast<unsigned long long*>(smem + L.cand);
    uint32_t* mk = reinterpret_cast<uint32_t*>(smem + L.mk);
    int units = 0, selected = 0;
    for (int k = 0;; ++k) {
      const int slot = k % SL;
      mbar_wait(&udone[slot], uint32_t((k / SL) & 1));
      const int* um = umeta + slot * kMetaInts;
      const int s = um[0];
      if (s < 0) break;
      const int b0 = um[1], nb = um[2], tok0 = um[3], qlen = um[4], seq_len = um[5], nv = um[6];
      const int n_blk = request_blocks(a, qlen, seq_len);
      int* mxs = mx + slot * 16 * U;
      for (int e = lane; e < nv * nb; e += 32) {
        const int v = e / nb, j = e - v * nb, b = b0 + j;
        const int nbr = (seq_len - qlen + v / a.H) / kBlock + 1;
        const float mval = dec_max(mxs[v * U + j]);
        mxs[v * U + j] = enc_max(kNegInf);
        const float score = b < nbr ? forced_score(mval * a.scale, b, nbr, a.init_blocks, a.local_blocks) : kNegInf;
        const int64_t row = (int64_t(tok0) + v / a.H) * a.H + v % a.H;
        if (!kPoll || a.fill_tail) a.sbuf[row * a.mbps + b] = score;
        // Polled: only the blocks the row's selection reads (each is read and zeroed once).
        if (kPoll && b < nbr) st_relaxed_gpu(a.rec + row * a.rec_stride + b, order_key(score));
      }
      mbar_arrive(&ufree[slot]);  // this lane has read the slot's record and reset its maxima
      __syncwarp();
      int last = 0;
      if (kPoll) {
        last = b0 + nb == n_blk;  // the unit of the request's last block selects
      } else {
        if (lane == 0) {
          // Release: the warp's score stores (ordered before by __syncwarp) before the count.
          fence_acq_rel_gpu();
          last = atomicAdd(a.req_done + s, nb) + nb == n_blk;
        }
        last = __shfl_sync(0xffffffffu, last, 0);
      }
      ++units;
      if (!last) continue;
      // ---- this unit completes request s: select each row's top-k from its score row.
      if (!kPoll) fence_acq_rel_gpu();  // acquire: every unit's scores of the request
      if (tr && lane == 0) tr[5] = global_ns();
      ++selected;
      for (int v = 0; v < nv; ++v) {
        const int64_t row = (int64_t(tok0) + v / a.H) * a.H + v % a.H;
        const int n = min((seq_len - qlen + v / a.H) / kBlock + 1, a.max_blocks);
        if (kPoll) {
          // Every unit's order keys, as their stores land (no fence, no counter); zeroed after.
          poll_row(a.rec + row * a.rec_stride, n, keys, lane);
          select_row_staged<kMinCtas <= 2 ? 4 : 1, false>(keys, n, K, cand, mk, a.topk_idx + row * K, lane);
        } else {
          // The row staged by cp.async (one L2 round trip, no registers), then selected.
          uint32_t* rk = stage_row_async(a.sbuf + row * a.mbps, n, keys, lane);
          select_row_staged<kMinCtas <= 2 ? 4 : 1>(rk, n, K, cand, mk, a.topk_idx + row * K, lane);
        }
        if (a.fill_tail)
          for (int j = n_blk + lane; j < a.mbps; j += 32) a.sbuf[row * a.mbps + j] = kNegInf;
      }
      if (!kPoll && lane == 0) a.req_done[s] = 0;
      if (tr && lane == 0) tr[6] = global_ns();
    }
    if (tr && lane == 0) {
      tr[3] = global_ns();
      tr[kTracePoints] = units;
      tr[kTracePoints + 1] = selected;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    // The last CTA out returns the unit counter to zero for the next call.
    if (claims) {
      __threadfence();
      if (atomicAdd(a.work + 1, 1) == int(gridDim.x) - 1) {
        a.work[0] = 0;
        a.work[1] = 0;
      }
    }
    if (tr) tr[4] = global_ns();
  }
}

// ---------------------------------------------------------------------------------------------
// Host side (the grid: plan_persistent in planner.cu)

void print_trace(bool fp8, const IndexerArgs& a, int N, int P, uint32_t smem, const std::vector<unsigned long long>& tr) {
  std::fprintf(stderr,
               "indexer persistent trace (%s): %d seqs, %d CTAs (SMs %d), unit %d blocks, %d units, stages %d, "
               "slots %d, static %d, smem %u B\n",
               fp8 ? "fp8" : "bf16", N, P, num_sms(), a.unit, a.dense_units, a.stages, a.slots, a.static_units, smem);
  const char* names[kTracePoints] = {"start",    "first block", "consumed", "finisher", "end",
                                     "counted",  "selected",    "q in",     "block 0 max"};
  print_trace_quantiles(names, kTracePoints, kTraceSlots, tr, P);
  std::vector<int> units;
  for (int c = 0; c < P; ++c) units.push_back(int(tr[size_t(c) * kTraceSlots + kTracePoints]));
  std::sort(units.begin(), units.end());
  std::fprintf(stderr, "  units per CTA: min %d median %d max %d\n", units.front(), units[units.size() / 2],
               units.back());
}

// The instantiation that runs with `per_sm` CTAs per SM: with an fp8 cache, two or fewer get their
// own (launch bounds for two CTAs: 80 registers instead of 64); `poll`: the polled finish;
// `narrow`: the narrow MMA (indexer_narrow).
using PersistentKernel = void (*)(IndexerArgs);
template <bool kNarrow>
PersistentKernel kernel_of(bool fp8, int per_sm, bool poll) {
  if (!fp8)
    return poll ? decode_persistent_kernel<false, 2, true, kNarrow> : decode_persistent_kernel<false, 2, false, kNarrow>;
  if (per_sm <= 2)
    return poll ? decode_persistent_kernel<true, 2, true, kNarrow> : decode_persistent_kernel<true, 2, false, kNarrow>;
  return poll ? decode_persistent_kernel<true, 3, true, kNarrow> : decode_persistent_kernel<true, 3, false, kNarrow>;
}
PersistentKernel persistent_kernel(bool fp8, int per_sm, bool poll, bool narrow) {
  return narrow ? kernel_of<true>(fp8, per_sm, poll) : kernel_of<false>(fp8, per_sm, poll);
}

}  // namespace

int persistent_resident_per_sm(bool fp8, int per_sm, bool narrow, uint32_t smem) {
  static std::mutex mu;
  static std::map<std::pair<PersistentKernel, uint32_t>, int> cache;
  const PersistentKernel kernel = persistent_kernel(fp8, per_sm, false, narrow);
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, smem);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  int n = 0;
  set_smem(kernel, smem);
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, smem), "occupancy v4");
  cache[key] = n;
  return n;
}

void launch_decode_persistent(const IndexerArgs& a_in, bool fp8, int per_sm, bool poll, bool narrow, int ctas,
                              uint32_t smem, bool pdl, cudaStream_t stream) {
  IndexerArgs a = a_in;
  a.trace = trace_alloc(tuning().indexer.trace, size_t(ctas) * kTraceSlots, stream);
  const PersistentKernel kernel = persistent_kernel(fp8, per_sm, poll, narrow);
  set_smem(kernel, smem);
  launch_pdl(pdl, kernel, ctas, kThreads, smem, stream, "indexer decode persistent", a);
  if (a.trace) print_trace(fp8, a, a.num_seqs, ctas, smem, trace_collect(a.trace, size_t(ctas) * kTraceSlots, stream));
}

}  // namespace sieve::cuda
