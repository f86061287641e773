// Definitions of the benchmark's harness (harness.cuh).
#include "kernels/bench/harness.cuh"

#include <chrono>

namespace sieve::kernels_bench {

namespace {

__device__ __forceinline__ float hash_uniform(uint64_t seed, uint64_t i) {
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + i * 0xBF58476D1CE4E5B9ull;
  x ^= x >> 31;
  x *= 0x94D049BB133111EBull;
  x ^= x >> 29;
  return float(x >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
}

// kind 0: bf16 in [-a, a]; 1: fp8 of [-a*448, a*448]; 2: f32 in [lo, lo + a]
__global__ void fill_kernel(void* p, int kind, size_t n, uint64_t seed, float a, float lo) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float u = hash_uniform(seed, i);
    if (kind == 0) static_cast<uint16_t*>(p)[i] = cuda::f32_to_bf16_bits(u * a);
    else if (kind == 1) static_cast<uint8_t*>(p)[i] = cuda::f32_to_fp8_bits(u * a * 448.f);
    else static_cast<float*>(p)[i] = lo + (u * 0.5f + 0.5f) * a;
  }
}

__global__ void __launch_bounds__(32) read_probe_kernel(ProbeRuns r, const int32_t* __restrict__ ids, int n, int per_cta,
                                                        int stages, unsigned* sink) {
  extern __shared__ __align__(128) uint8_t sm[];
  uint64_t* bars = reinterpret_cast<uint64_t*>(sm);
  uint8_t* ring = sm + 128;
  const int i0 = blockIdx.x * per_cta, cnt = min(n, i0 + per_cta) - i0;
  if (threadIdx.x != 0 || cnt <= 0) return;
  for (int s = 0; s < stages; ++s) cuda::mbar_init(&bars[s], 1);
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  const bool hinted = r.l2_first != 0;
  const uint64_t policy = hinted ? cuda::l2_policy_evict_first() : 0;
  auto issue = [&](int i) {
    const int s = i % stages;
    const int64_t id = __ldg(ids + i0 + i);
    cuda::mbar_expect_tx(&bars[s], r.item_bytes);
    uint32_t off = 0;
    for (int j = 0; j < r.runs; ++j) {
      cuda::bulk_copy_policy(ring + size_t(s) * r.item_bytes + off, r.base[j] + id * r.bytes[j], r.bytes[j],
                             &bars[s], hinted, policy);
      off += r.bytes[j];
    }
  };
  int issued = 0;
  for (; issued < min(cnt, stages); ++issued) issue(issued);
  unsigned acc = 0;
  for (int i = 0; i < cnt; ++i) {
    const int s = i % stages;
    cuda::mbar_wait(&bars[s], uint32_t(i / stages) & 1u);
    acc += *reinterpret_cast<volatile unsigned*>(ring + size_t(s) * r.item_bytes);
    if (issued < cnt) issue(issued++);
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;  // keeps the reads observable
}

float median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.f : v[v.size() / 2];
}

}  // namespace

void fill(void* p, int kind, size_t n, uint64_t seed, float a, float lo) {
  fill_kernel<<<1024, 256>>>(p, kind, n, seed, a, lo);
  cuda_check(cudaGetLastError(), "fill");
}

std::function<void(int, cudaStream_t)> ReadProbe::fn(bool l2_first) {
  for (ProbeRuns& r : runs) r.l2_first = l2_first;
  const uint32_t item = runs.at(0).item_bytes;
  const int n = int(ids.at(0)->bytes / sizeof(int32_t));
  for (const DevPtr& l : ids)
    if (l->bytes != ids[0]->bytes) throw Error("bench: read probe lists of different lengths");
  const int stages = std::clamp(int(73728 / item), 1, 3);
  const size_t smem = 128 + size_t(stages) * item;
  cuda_check(cudaFuncSetAttribute(read_probe_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, int(smem)),
             "read probe smem");
  int occ = 0;
  cuda_check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, read_probe_kernel, 32, smem), "read probe occupancy");
  const int ctas = std::max(1, std::min(n, std::clamp(occ, 1, 3) * cuda::num_sms()));
  const int per = (n + ctas - 1) / ctas;
  const int grid = std::max(1, (n + per - 1) / per);
  return [this, n, stages, per, grid, smem](int s, cudaStream_t st) {
    const size_t k = size_t(s) % runs.size();
    read_probe_kernel<<<grid, 32, smem, st>>>(runs[k], ids[k]->as<int32_t>(), n, per, stages, sink->as<unsigned>());
  };
}

double time_it(int iters, int sets, const std::function<void(int, cudaStream_t)>& fn, bool graph,
               cudaStream_t stream, int batch) {
  std::vector<cudaGraphExec_t> execs;
  if (graph) {
    const int ngraphs = batch > 1 ? 1 : sets;
    for (int s = 0; s < sets; ++s) fn(s, stream);  // sizes the workspace outside capture
    for (int gi = 0; gi < ngraphs; ++gi) {
      cudaGraph_t g;
      cuda_check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), "capture");
      if (batch > 1) {
        for (int i = 0; i < batch; ++i) fn(i % sets, stream);
      } else {
        fn(gi, stream);
      }
      cuda_check(cudaStreamEndCapture(stream, &g), "end capture");
      cudaGraphExec_t e;
      cuda_check(cudaGraphInstantiate(&e, g, 0), "instantiate");
      cudaGraphDestroy(g);
      execs.push_back(e);
    }
  }
  auto launch = [&](int i) {
    if (graph) cuda_check(cudaGraphLaunch(execs[size_t(i) % execs.size()], stream), "graph launch");
    else fn(i % sets, stream);
  };
  for (int i = 0; i < std::max(10, sets * 2); ++i) launch(i);
  std::vector<cudaEvent_t> ev(size_t(iters) * 2);
  for (auto& e : ev) cuda_check(cudaEventCreate(&e), "event");
  for (int i = 0; i < iters; ++i) {
    cudaEventRecord(ev[size_t(2 * i)], stream);
    launch(i);
    cudaEventRecord(ev[size_t(2 * i + 1)], stream);
  }
  cuda_check(cudaStreamSynchronize(stream), "bench sync");
  std::vector<float> ms(static_cast<size_t>(iters));
  for (int i = 0; i < iters; ++i) cudaEventElapsedTime(&ms[size_t(i)], ev[size_t(2 * i)], ev[size_t(2 * i + 1)]);
  for (auto& e : ev) cudaEventDestroy(e);
  for (auto& e : execs) cudaGraphExecDestroy(e);
  return double(median(ms)) * 1000.0 / (graph && batch > 1 ? batch : 1);
}

void warm_up(int sets, const std::function<void(int, cudaStream_t)>& fn, cudaStream_t stream, int ms) {
  int i = 0;
  for (const auto t0 = std::chrono::steady_clock::now();
       std::chrono::steady_clock::now() - t0 < std::chrono::milliseconds(ms);) {
    for (int k = 0; k < 10; ++k, ++i) fn(i % sets, stream);
    cuda_check(cudaStreamSynchronize(stream), "bench warm-up");
  }
}

ops::QkvNormRopeCacheParams qkv_params(void* rows, int64_t tokens, const void* norm, const int32_t* positions,
                                       const float* cos_sin, const int64_t* slots, const ops::KvCacheView& kv,
                                       const ops::IndexCacheView& ic) {
  ops::QkvNormRopeCacheParams p;
  p.qkv = rows;
  p.act_dtype = DType::BF16;
  p.num_tokens = tokens;
  p.row_stride = kQkvStride;
  p.num_q_heads = 16, p.num_kv_heads = 1, p.head_dim = 128;
  p.q_offset = 0, p.k_offset = 2048, p.v_offset = 2176;
  p.num_index_heads = 1, p.index_dim = 128, p.index_q_offset = 2304, p.index_k_offset = 2432;
  p.q_norm = p.k_norm = p.index_q_norm = p.index_k_norm = norm;
  p.positions = positions;
  p.cos_sin = cos_sin;
  p.rotary_dim = 64;
  p.slot_mapping = slots;
  p.kv = kv;
  p.index_cache = ic;
  return p;
}

double qkv_bytes(int64_t tokens, bool fp8, bool index) {
  if (!index) return double(tokens) * ((2048 + 256) * 2.0 + 2048 * 2.0 + 2 * 128 * (fp8 ? 1 : 2) + (fp8 ? 8 : 0));
  return double(tokens) * (kQkvStride * 2.0 + (2048 + 128) * 2.0 + 3 * 128 * (fp8 ? 1 : 2) + (fp8 ? 8 : 0));
}

std::string ctx_name(const BatchShape& s) {
  if (s.cached.size() == 1 && s.qlen[0] > 1)
    return std::to_string(s.qlen[0]) + " new" + (s.cached[0] ? " after " + std::to_string(s.cached[0]) : "");
  return "b" + std::to_string(s.cached.size()) + " ctx" + std::to_string(s.cached[0] + s.qlen[0]);
}

BatchShape decode_shape(int batch, int ctx) {
  BatchShape s;
  s.cached.assign(size_t(batch), ctx - 1);
  s.qlen.assign(size_t(batch), 1);
  return s;
}
BatchShape prefill_shape(int cached, int n) {
  BatchShape s;
  s.cached = {cached};
  s.qlen = {n};
  return s;
}

}  // namespace sieve::kernels_bench
