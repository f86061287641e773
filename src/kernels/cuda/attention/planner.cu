// Paged GQA attention (ops::AttentionParams), host side: the prefill tiles where they apply
// (attention_prefill.cu), else the decode kernel (decode_kernel.cu, which describes the design)
// with its grid from shapes only (topk, num_tokens, batch.max_seq_len, the SM count), so a CUDA
// graph captured at one shape replays the same launch. AttentionTuning (tuning.h) forces grid
// choices for the tests and the benchmark.
#include <algorithm>
#include <cstdio>
#include <vector>

#include "kernels/cuda/attention/decode.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"
#include "kernels/cuda/internal.h"
#include "kernels/cuda/tuning.h"

namespace sieve::cuda {

using namespace attn;

namespace {

// AttentionTuning::trace 1: every call is synchronised and prints where its CTAs spent their
// time (global timer, ns from the first CTA's start): a development aid, never on in serving;
// 2 also prints every CTA's SM and phase times.
int trace_level() { return tuning().attention.trace; }
bool trace_enabled() { return trace_level() > 0; }
void print_trace(const AttnArgs& a, const std::vector<unsigned long long>& tr, int64_t ctas) {
  const bool fp8 = a.k_scale != nullptr;
  const char* names[kTracePoints] = {"start", "prologue", "issued", "first K", "loop end", "cta merged",
                                     "cluster sync", "end", "row merged"};
  std::fprintf(stderr,
               "attention trace: %lld CTAs, splits %d cluster %d groups %d (%s merge) per_split %d stages %d consumer "
               "groups %d\n",
               (long long)ctas, a.splits, a.cluster, a.groups, a.groups == 1 ? "no global" : a.ll ? "flagged" : "last-CTA",
               a.per_split, a.stages, a.cgroups);
  for (int c : {2, 4, 8})
    std::fprintf(stderr, "  max active clusters of %d at %d stages: %d\n", c, a.stages,
                 max_active_clusters(fp8, a.cgroups, c, a.stages));
  print_trace_quantiles(names, kTracePoints, kTraceSlots, tr, ctas);
  if (trace_level() < 2) return;
  const unsigned long long t0 = trace_origin(tr, kTraceSlots, ctas);
  auto at = [&](int64_t c, int i) {
    const unsigned long long x = tr[size_t(c * kTraceSlots + i)];
    return x ? double(x - t0) / 1000.0 : -1.0;
  };
  for (int64_t c = 0; c < ctas; ++c)
    std::fprintf(stderr, "  cta %lld sm %d: first K %.2f loop end %.2f cta merged %.2f cluster sync %.2f end %.2f\n",
                 (long long)c, int(tr[size_t(c * kTraceSlots + kTracePoints)]) - 1, at(c, 3), at(c, 4), at(c, 5),
                 at(c, 6), at(c, 7));
}

}  // namespace

bool run_attention(const ops::AttentionParams& p, void* stream_v) {
  if (p.head_dim != kDim || p.kv.head_dim != kDim || p.kv.block_size != kBlock) return false;
  if (p.kv.dtype != DType::BF16 && p.kv.dtype != DType::FP8_E4M3) return false;
  if (p.q_dtype != DType::BF16 && p.q_dtype != DType::F32) return false;
  if (p.out_dtype != DType::BF16 && p.out_dtype != DType::F32) return false;
  if (p.num_kv_heads <= 0 || p.num_q_heads % p.num_kv_heads != 0) return false;
  const int gqa = p.num_q_heads / p.num_kv_heads;
  if (gqa > 16) return false;
  if (p.topk_idx && p.topk <= 0) return false;
  const bool fp8 = p.kv.dtype == DType::FP8_E4M3;
  if (fp8 && (!p.kv.k_scale || !p.kv.v_scale)) return false;
  if (p.batch.num_tokens == 0 || p.batch.num_seqs == 0) return true;
  if (use_prefill_attention(p) && run_attention_prefill(p, stream_v)) return true;
  cudaStream_t stream = static_cast<cudaStream_t>(stream_v);

  AttnArgs a{};
  fill_attention_args(a, p);
  {
    const size_t esz = a.q_bf16 ? 2 : 4;
    a.q_vec = reinterpret_cast<uintptr_t>(p.q) % (4 * esz) == 0 && (p.q_stride * esz) % (4 * esz) == 0;
    a.q_bulk = reinterpret_cast<uintptr_t>(p.q) % 16 == 0 && (p.q_stride * esz) % 16 == 0;
  }
  {
    const size_t esz = a.out_bf16 ? 2 : 4;
    a.out_vec = reinterpret_cast<uintptr_t>(p.out) % (4 * esz) == 0 && (p.out_stride * esz) % (4 * esz) == 0;
  }
  a.gqa = gqa;
  a.k = static_cast<const uint8_t*>(p.kv.k);
  a.v = static_cast<const uint8_t*>(p.kv.v);
  a.k_scale = p.kv.k_scale;
  a.v_scale = p.kv.v_scale;

  // Splits from shapes only. About two resident CTAs per SM; one cluster of up to 8 CTAs per
  // row when that already covers the GPU, else several clusters per row.
  const int64_t rows = p.batch.num_tokens * p.num_kv_heads;
  const int sms = num_sms();
  const int units = p.topk_idx ? p.topk
                               : std::max(1, std::min((p.batch.max_seq_len + kBlock - 1) / kBlock,
                                                      p.batch.max_blocks_per_seq));
  const AttentionTuning& tu = tuning().attention;
  const int max_cluster = std::clamp(tu.max_cluster, 1, kMaxCluster);
  const int max_stages = std::clamp(tu.max_stages, 2, kMaxStages);
  const int force_splits = tu.splits > 0 ? std::min(tu.splits, kMaxSplits) : 0;
  const int force_groups = tu.consumer_groups > 0 ? std::min(tu.consumer_groups, 2) : 0;
  // Up to about 33 rows on the H200 (at least 4 splits a row): one CTA per SM, each with two
  // consumer groups (8 consumer warps, ~200 KB of K/V in flight), floor(SMs / rows) splits a row,
  // so the grid is one wave. Measured at batch 32, context 9216 (4 splits in 2 clusters of 2):
  // 38.8 us against 42.5 for 8 splits in clusters of 2 at two CTAs per SM (dense, fp8), 19.2
  // against 21.7 (sparse, fp8). More rows: about two CTAs (one group each) per SM.
  const bool one_per_sm = rows * 4 <= sms;
  // Q by one bulk copy (16-byte aligned rows): with bf16 KV at every shape (sparse b32 ctx9216
  // 19.4 -> 19.1 us, dense 46.9 -> 46.4); with fp8 KV for sparse rows at one CTA per SM only
  // (b32 ctx9216 14.2 -> 13.5 us) — dense fp8 rows and sparse b128 measured 1-2.4 % slower with
  // it (docs/performance.md). AttentionTuning::q_bulk 0 / 1 forces it off / on (where aligned).
  if (tu.q_bulk == 0) a.q_bulk = false;
  else if (tu.q_bulk < 0 && fp8 && !(p.topk_idx && one_per_sm)) a.q_bulk = false;
  int splits = int(std::clamp<int64_t>(one_per_sm ? sms / rows : (2 * sms + rows - 1) / rows, 1,
                                       std::min(units, kMaxSplits)));
  a.cgroups = force_groups ? force_groups : (one_per_sm ? 2 : 1);
  const int max_slots = std::min(max_stages, fp8 ? (a.cgroups == 2 ? Geo<true>::kMaxSlots2 : Geo<true>::kMaxSlots1)
                                                 : (a.cgroups == 2 ? Geo<false>::kMaxSlots2 : Geo<false>::kMaxSlots1));
  // Each consumer group has its own half of the ring (slot_of): an even count with two groups,
  // at least 2 slots (one unit's K and V) per group.
  const int min_slots = 2 * a.cgroups;
  auto stages_for = [&](int per_split) {
    const int n = std::max(min_slots, std::min(2 * per_split, max_slots));
    return n - n % a.cgroups;
  };
  auto resident = [&](int c, int per_split) { return max_active_clusters(fp8, a.cgroups, c, stages_for(per_split)); };
  a.cluster = 1;
  if (force_splits) {
    splits = std::min(force_splits, units);
    a.cluster = std::min(splits, max_cluster);
  } else if (!one_per_sm) {
    // Enough rows to fill the GPU with one cluster per row: the largest cluster (<= 8 CTAs,
    // each a split of the row) with which every row's cluster is resident at once. The merge is
    // then entirely in distributed shared memory. Rows too many for that: plain CTAs.
    splits = std::min(splits, kMaxCluster);
    for (int c : {8, 4, 2}) {
      if (c > max_cluster || c > units) continue;
      if (rows <= resident(c, (units + c - 1) / c)) {
        a.cluster = c;
        splits = c;
        break;
      }
    }
  } else if (const int c1 = std::min(max_cluster, (units + 1) / 2);
             c1 >= 2 && units <= 2 * c1 && rows <= resident(c1, 2)) {
    // Few rows and at most two units a CTA in one cluster (one unit per consumer group, the two
    // streamed at once): one cluster per row, merged in distributed shared memory only. Measured
    // at batch 1, context 9216, sparse (16 units): 9.9 us (fp8) / 10.0 (bf16) against 12.3 /
    // 11.3 for 16 splits in 2 clusters of 8 merged through global memory.
    a.cluster = c1;
    splits = c1;
  } else {
    // Few rows: several clusters per row (a last-CTA merge over global memory joins them), the
    // largest power-of-two cluster (<= 8) with which they are all resident.
    const int c0 = std::min(splits, max_cluster);
    for (int c : {c0, std::min(c0 - 1, 4), std::min(c0 - 1, 2)}) {
      if (c < 2 || (c != c0 && (c & (c - 1)))) continue;
      const int groups = (splits + c - 1) / c;
      if (rows * groups <= resident(c, (units + c * groups - 1) / (c * groups))) {
        a.cluster = c;
        break;
      }
    }
  }
  a.groups = (splits + a.cluster - 1) / a.cluster;
  a.splits = a.cluster * a.groups;
  a.per_split = (units + a.splits - 1) / a.splits;
  a.stages = stages_for(a.per_split);
  // Two clusters a row: the flagged merge when every CTA of the grid is resident at once (the
  // first cluster waits for the second's records), else, and with more clusters a row, partials
  // and a last-CTA merge. Measured (H200): batch 32 (two clusters of 2 a row) sparse fp8 15.0 ->
  // 14.1 us, dense fp8 31.5 -> 30.8; with 8 or 9 clusters a row (dense, batch 1 and 8) the
  // flagged merge was slower (b1 bf16 14.9 -> 17.0 us), so it is not used there.
  a.ll = tu.flagged_merge && a.groups == 2 && a.cluster > 1 &&
         rows * a.groups <= max_active_clusters(fp8, a.cgroups, a.cluster, a.stages);
  if (a.ll) {
    const size_t records = size_t(rows) * (a.groups - 1) * 16 * kDim;  // kN = 1 at most
    a.ll_buf = static_cast<uint4*>(private_scratch(stream, kScratchAttentionMerge, records * kLLChunks * 16));
  } else if (a.groups > 1) {
    const size_t n = size_t(rows) * a.groups * 16;
    char* ws = static_cast<char*>(workspace(stream, n * (kDim + 2) * 4));
    a.part_o = reinterpret_cast<float*>(ws);
    a.part_ml = reinterpret_cast<float*>(ws + n * kDim * 4);
    a.counters = zeroed_counters(stream, size_t(rows));
  }
  // L2 evict-first K/V copies (internal.h) when each request has one query row (decode: no
  // block is read again by another row of the grid) and the call streams at least
  // kL2HintMinBytes. Measured (docs/performance.md): b32 ctx9216 sparse fp8 / bf16 -6.7 / -6.5 %,
  // dense bf16 -2.9 %; sparse b1 +1.1-1.8 % (a 0.5-1 MB stream), hence the threshold. With
  // several rows a request the rows read the same blocks and keep the default policy.
  // AttentionTuning::l2_evict_first 0 / 1 forces it off / on.
  const int64_t unit_bytes = 2 * (fp8 ? Geo<true>::kSlotBytes : Geo<false>::kSlotBytes);  // K and V
  a.l2_first = l2_evict_first(p.batch.max_query_len <= 1 ? rows * units * unit_bytes : 0, tu.l2_evict_first);
  const int64_t ctas = int64_t(a.splits) * p.batch.num_tokens * p.num_kv_heads;
  a.trace = trace_alloc(trace_enabled(), size_t(ctas) * kTraceSlots, stream);
  launch(a, fp8, p.batch.num_tokens, p.num_kv_heads, stream);
  if (a.trace) print_trace(a, trace_collect(a.trace, size_t(ctas) * kTraceSlots, stream), ctas);
  return true;
}

}  // namespace sieve::cuda

