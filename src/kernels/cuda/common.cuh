// Shared device helpers of the sm_90a kernels: mma.sync wrappers, fp8/bf16/f16 conversions,
// the per-device (per scratch set) workspace, and launch checks.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "kernels/ops.h"

namespace sieve::cuda {

inline void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}
#define SIEVE_LAUNCH_CHECK(what) ::sieve::cuda::cuda_check(cudaGetLastError(), what)

// Grow-only scratch memory per device and scratch set (stream_scratch.h: a side stream has a set
// of its own) for split partials and merge counters. It is never freed or moved while a graph
// may hold its address: it grows only outside stream capture (a growth needed during capture is
// an error: run one eager call of the shape first). The kernels of one set never run at once.
void* workspace(cudaStream_t stream, size_t bytes);
// Zero-initialised int32 counters that the kernels return to zero themselves (last-CTA merges).
int32_t* zeroed_counters(cudaStream_t stream, size_t count);
// Zero-initialised scratch that only the kernel named by `id` (kScratch*) uses: it keeps what
// that kernel leaves in it between calls (the kernel's own protocol returns it to zero) and is
// never shared with another kernel. Grows like `workspace` (a new, zeroed buffer).
enum ScratchId : int {
  kScratchAttentionMerge = 0,
  kScratchIndexerPoll = 1,
  kScratchMatmulX = 2,  // matmul: fp32 x rounded to bf16 for cuBLAS
  kScratchMoe = 3,      // moe_experts: expert lists, intermediate rows
  kScratchLinear = 4,   // linear: x quantized to fp8 + its scales (and cuBLASLt's transposed scales)
  kScratchLinearLt = 5,  // linear through cuBLASLt: its workspace
  kScratchSample = 6,    // sample: the per-chunk partials of each row
};
void* private_scratch(cudaStream_t stream, int id, size_t bytes);
// Development traces (the trace fields of tuning.h): trace_alloc gives a zeroed device buffer of
// `words` timestamps when `enabled` and the stream is not being captured (a trace is read back
// right after its call), else nullptr; trace_collect copies it back, synchronising the stream,
// and frees it.
unsigned long long* trace_alloc(bool enabled, size_t words, cudaStream_t stream);
std::vector<unsigned long long> trace_collect(unsigned long long* trace, size_t words, cudaStream_t stream);

int num_sms();

// Programmatic dependent launch (PDL) of the decode-step kernels (cache write, decode indexers,
// attention): launched with programmatic stream serialisation, a kernel may start while the
// previous kernel of the stream is still running. Each such kernel lets its dependents start
// at once (pdl_trigger at its top), does what needs no step data before pdl_wait — reading the
// batch metadata (query_start_loc, seq_lens, block_tables) and copying cache blocks that hold
// only tokens older than the request's first new token — and everything else after it; every
// thread of every CTA passes pdl_wait before it writes global memory or exits, so a grid never
// completes before the one it depends on. The contract this relies on is in kernels/ops.h.
// Which kernels are launched so: by default the decode indexers always, sparse attention when the
// batch has at most kPdlAttentionMaxTokens query tokens, dense attention up to
// kPdlDenseAttentionMaxTokens, the cache write never (measured on the H200, docs/performance.md:
// a sparse layer's decode step gains at every batch size from the indexer's PDL, and from the
// attention's only up to 4 tokens; a dense layer's step, cache write then dense attention, gains
// from the attention's at every decode batch size measured). LaunchTuning::pdl_mask (tuning.h:
// 1 cache write, 2 decode indexers, 4 attention) replaces that choice.
enum PdlKernel : int { kPdlCacheWrite = 1, kPdlIndexer = 2, kPdlAttention = 4, kPdlAll = 7 };
constexpr int64_t kPdlAttentionMaxTokens = 4;
constexpr int64_t kPdlDenseAttentionMaxTokens = 128;
// `dense`: for kPdlAttention, the call is dense attention (no top-k).
bool pdl_enabled(PdlKernel k, int64_t num_tokens, bool dense = false);

// The small kernels of a decode step (rms_norm, add, embedding, swiglu_oai, moe_route's routing
// kernels) follow the same rule with programmatic dependent launch: pdl_trigger at the top, only
// weights (never written by a kernel) touched before pdl_wait, and every thread through pdl_wait
// before it writes global memory or exits. chain_pdl says whether a call of `rows` rows on
// `stream` is launched so (LaunchTuning::chain_pdl): by default calls of at most
// kPdlChainMaxRows rows (decode and speculative verification; a prefill's kernels are long enough
// that their launch hides behind the one before anyway), never on the legacy default stream
// (which the parity tests use: launches there stay plain, as the FP8 GEMM's do).
constexpr int64_t kPdlChainMaxRows = 256;
bool chain_pdl(cudaStream_t stream, int64_t rows);
// The cache write (qkv_norm_rope_cache): pdl_enabled(kPdlCacheWrite) under an explicit
// LaunchTuning::pdl_mask; with the default mask, the chain's rule (in the model it follows the
// qkv projection, which writes no batch metadata).
bool cache_write_pdl(cudaStream_t stream, int64_t num_tokens);

// Launches `kernel`, with programmatic stream serialisation when `pdl` (e.g. pdl_enabled(k)).
template <class... P, class... A>
void launch_pdl(bool pdl, void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                const char* what, A&&... args) {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attr[1]{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  cuda_check(cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...), what);
}

// Device side of PDL: the kernels of the next launch may be scheduled (once every CTA of this
// grid has said so or exited); and waits until the grid this one depends on has completed and
// its writes are visible (returns at once when launched plainly).
__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Brings `bytes` from p into L2, one prefetch a 128-byte line, the lines spread over every thread
// of the grid: a PDL kernel's prologue for the weights it reads after pdl_wait.
__device__ __forceinline__ void prefetch_l2(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  const int64_t step = int64_t(gridDim.x) * gridDim.y * blockDim.x * 128;
  const int64_t first = (int64_t(blockIdx.y) * gridDim.x + blockIdx.x) * blockDim.x + threadIdx.x;
  for (int64_t o = first * 128; o < bytes; o += step) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(c + o));
}

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kNegInf = -__builtin_huge_valf();

// ---------------------------------------------------------------------------------------------
// Device helpers

__device__ __forceinline__ float bf16_to_f32(uint16_t b) { return __uint_as_float(uint32_t(b) << 16); }

__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
  __nv_bfloat16 h = __float2bfloat16_rn(f);
  return *reinterpret_cast<uint16_t*>(&h);
}
__device__ __forceinline__ float round_bf16(float f) { return bf16_to_f32(f32_to_bf16_bits(f)); }

__device__ __forceinline__ uint8_t f32_to_fp8_bits(float f) {
  return uint8_t(__nv_cvt_float_to_fp8(f, __NV_SATFINITE, __NV_E4M3));
}
__device__ __forceinline__ float fp8_to_f32(uint8_t v) {
  __half_raw h = __nv_cvt_fp8_to_halfraw(v, __NV_E4M3);
  return __half2float(__half(h));
}

// Two packed e4m3 (low byte first) -> f16x2 (low half first); exact.
__device__ __forceinline__ uint32_t fp8x2_to_f16x2(uint16_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
  return uint32_t(h.x) | (uint32_t(h.y) << 16);
}
// Two packed e4m3 -> bf16x2; exact (e4m3 values are normal bf16 numbers).
__device__ __forceinline__ uint32_t fp8x2_to_bf16x2(uint16_t v) {
  __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(v, __NV_E4M3);
  float2 f = __half22float2(__half2(h));
  __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
  return *reinterpret_cast<uint32_t*>(&b);
}
// Release + acquire fence at GPU scope (lighter than __threadfence's sequentially consistent one).
__device__ __forceinline__ void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;\n" ::: "memory"); }
// 2^x with the special function unit (ex2.approx.ftz: relative error ~2^-22; results below
// 2^-126 flush to 0; 2^-inf = 0).
__device__ __forceinline__ float ex2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 b = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&b);
}
__device__ __forceinline__ uint32_t pack_f16x2(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
// bf16x2 -> f16x2 (used when a bf16 operand meets f16 fp8-derived operands).
__device__ __forceinline__ uint32_t bf16x2_to_f16x2(uint32_t v) {
  return pack_f16x2(__uint_as_float(v << 16), __uint_as_float(v & 0xffff0000u));
}

// D = A(16x16, row) * B(16x8, col) + D, fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void mma_f16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
      "{%8,%9}, {%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <bool kF16>
__device__ __forceinline__ void mma16816(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  if constexpr (kF16) {
    mma_f16(d, a, b0, b1);
  } else {
    mma_bf16(d, a, b0, b1);
  }
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// 16-byte global load that bypasses L1 (streamed cache data is read once).
__device__ __forceinline__ uint4 ldg_stream(const void* p) {
  uint4 r;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(p));
  return r;
}

// Four consecutive activation elements as floats, from one 8-byte load of four bf16 or one
// 16-byte load of four f32.
__device__ __forceinline__ void unpack_bf16x4(uint2 u, float (&x)[4]) {
  x[0] = __uint_as_float(u.x << 16), x[1] = __uint_as_float(u.x & 0xffff0000u);
  x[2] = __uint_as_float(u.y << 16), x[3] = __uint_as_float(u.y & 0xffff0000u);
}
__device__ __forceinline__ void unpack_f32x4(float4 f, float (&x)[4]) { x[0] = f.x, x[1] = f.y, x[2] = f.z, x[3] = f.w; }

// Loads one element of an activation (F32 or BF16) as fp32.
__device__ __forceinline__ float load_act(const void* p, int64_t i, bool bf16) {
  return bf16 ? bf16_to_f32(static_cast<const uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
}

// The permuted k-slot -> dim mapping of m16n8k16 over 128-dim rows (Q K^T, index q . k): for
// k-step s, quad lane q, the four dims this lane's slots (2q, 2q+1 | 2q+8, 2q+9) stand for are
// dbase + {0,1 | 2,3}; chosen so a lane's dims for all 8 k-steps are 16-byte runs in memory.
template <bool kFp8>
__device__ __forceinline__ int dbase(int s, int q) {
  return kFp8 ? (s / 4) * 64 + q * 16 + (s % 4) * 4 : (s / 2) * 32 + q * 8 + (s % 2) * 4;
}

// The "beats" order of top-k: higher score, then lower block id.
__device__ __forceinline__ bool beats(float sa, int ia, float sb, int ib) {
  return sa > sb || (sa == sb && ia < ib);
}

// x [m, k] (row stride ldx, fp32) -> out [m, k] bf16, packed, on `stream` (dense.cu).
void rows_to_bf16(const float* x, int64_t ldx, int64_t m, int64_t k, uint16_t* out, cudaStream_t stream);

// Raises a kernel's dynamic shared-memory limit once, to the most any launch asks for (launches
// of at most 48 KB need nothing).
template <class Kernel>
void set_smem(Kernel k, size_t bytes) {
  static std::mutex mu;
  static std::map<const void*, size_t> limit;
  if (bytes <= 48 * 1024) return;
  std::lock_guard<std::mutex> lock(mu);
  size_t& have = limit[reinterpret_cast<const void*>(k)];
  if (bytes <= have) return;
  cuda_check(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, int(bytes)),
             "cudaFuncSetAttribute");
  have = bytes;
}

// Launch configuration of a grid in thread-block clusters of `cluster` CTAs along x
// (attrs[0]); allow_programmatic_serialization() adds programmatic dependent launch. Not
// copyable: cfg.attrs points into the object.
struct ClusterLaunch {
  cudaLaunchConfig_t cfg{};
  cudaLaunchAttribute attrs[2]{};
  ClusterLaunch(dim3 grid, dim3 block, size_t smem, cudaStream_t stream, int cluster) {
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    attrs[0].id = cudaLaunchAttributeClusterDimension;
    attrs[0].val.clusterDim.x = unsigned(cluster);
    attrs[0].val.clusterDim.y = 1;
    attrs[0].val.clusterDim.z = 1;
    cfg.attrs = attrs;
    cfg.numAttrs = 1;
  }
  ClusterLaunch(const ClusterLaunch&) = delete;
  ClusterLaunch& operator=(const ClusterLaunch&) = delete;
  void allow_programmatic_serialization() {
    attrs[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[1].val.programmaticStreamSerializationAllowed = 1;
    cfg.numAttrs = 2;
  }
};

// How many clusters of `cluster` CTAs of `kernel` (`threads` per CTA, `smem` bytes of dynamic
// shared memory) the device keeps resident at once (cudaOccupancyMaxActiveClusters, asked with
// a grid of `grid_clusters` clusters); `on_error` where the query fails.
template <class Kernel>
int resident_clusters(Kernel kernel, int threads, size_t smem, int cluster, int grid_clusters, int on_error) {
  set_smem(kernel, smem);
  ClusterLaunch l(dim3(unsigned(cluster * grid_clusters), 1, 1), dim3(unsigned(threads), 1, 1), smem, nullptr,
                  cluster);
  int n = 0;
  if (cudaOccupancyMaxActiveClusters(&n, kernel, &l.cfg) != cudaSuccess) {
    (void)cudaGetLastError();
    n = on_error;
  }
  return n;
}

// The argument fields both attention kernels (attention.cu, attention_prefill.cu) take from the
// op's parameters as they are: q and out with their dtypes and strides, kv heads, the base-2
// softmax scale, the batch metadata and the top-k list (topk 0 when dense). The vector-access
// flags follow each kernel's own alignment rule and are set by the caller.
template <class A>
void fill_attention_args(A& a, const ops::AttentionParams& p) {
  a.q = p.q;
  a.q_bf16 = p.q_dtype == DType::BF16;
  a.q_stride = p.q_stride;
  a.out = p.out;
  a.out_bf16 = p.out_dtype == DType::BF16;
  a.out_stride = p.out_stride;
  a.nkv = p.num_kv_heads;
  a.scale_log2 = p.sm_scale * kLog2e;
  a.qsl = p.batch.query_start_loc;
  a.seq_lens = p.batch.seq_lens;
  a.block_tables = p.batch.block_tables;
  a.mbps = p.batch.max_blocks_per_seq;
  a.num_seqs = p.batch.num_seqs;
  a.topk_idx = p.topk_idx;
  a.topk = p.topk_idx ? p.topk : 0;
}

// ---------------------------------------------------------------------------------------------
// Shared memory addresses, mbarriers and 1-D bulk copies (TMA) into shared memory.

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// cp.async (16 bytes, through L2 only), its group commit and the wait for every group.
__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_u32(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count));
}
__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Arrives on `bar` and expects `bytes` more bytes of bulk copies to complete on it.
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
// Bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) completing on `bar`.
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
// Bulk store of `bytes` (a multiple of 16, both addresses 16-byte aligned) from shared to global
// memory in this thread's bulk async-group (bulk_store_commit closes the group). The shared-memory
// source must have been written before a fence_proxy_async of its writers.
__device__ __forceinline__ void bulk_store(void* dst, const void* src, uint32_t bytes) {
  asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(smem_u32(src)),
               "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// This thread's bulk stores have read their shared-memory sources (which may be written again).
__device__ __forceinline__ void bulk_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}
// This thread's bulk stores are complete (their global writes done).
__device__ __forceinline__ void bulk_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }
// The same with an L2 cache policy (createpolicy).
__device__ __forceinline__ void bulk_copy_hint(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                               uint64_t policy) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1], %2, [%3], %4;\n" ::"r"(smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar)), "l"(policy)
      : "memory");
}
__device__ __forceinline__ uint64_t l2_policy_evict_first() {
  uint64_t p;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  return p;
}
// One bulk copy that is the whole of the barrier's next phase.
__device__ __forceinline__ void bulk_load(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  mbar_expect_tx(bar, bytes);
  bulk_copy(dst, src, bytes, bar);
}
// bulk_copy / bulk_load under the L2 `policy` when `hinted` (a stream's l2_policy_evict_first),
// plain otherwise.
__device__ __forceinline__ void bulk_copy_policy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                 bool hinted, uint64_t policy) {
  if (hinted) bulk_copy_hint(dst, src, bytes, bar, policy);
  else bulk_copy(dst, src, bytes, bar);
}
__device__ __forceinline__ void bulk_load_policy(void* dst, const void* src, uint32_t bytes, uint64_t* bar,
                                                 bool hinted, uint64_t policy) {
  if (hinted) {
    mbar_expect_tx(bar, bytes);
    bulk_copy_hint(dst, src, bytes, bar, policy);
  } else {
    bulk_load(dst, src, bytes, bar);
  }
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done) {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_u32(bar)), "r"(parity)
        : "memory");
  }
}

// Global timer (ns), for the development traces.
__device__ __forceinline__ unsigned long long global_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// Max of x and of y over the 4 lanes of a quad (the lanes that share an MMA row).
__device__ __forceinline__ void quad_max2(float& x, float& y) {
#pragma unroll
  for (int o2 = 1; o2 <= 2; o2 <<= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o2));
    y = fmaxf(y, __shfl_xor_sync(0xffffffffu, y, o2));
  }
}

}  // namespace sieve::cuda
