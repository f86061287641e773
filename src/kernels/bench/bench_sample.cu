// `sieve bench kernels` rows "sample": the sample op (ops.h) over 32 and 128 logits rows of
// MiniMax-M3's 200,064-token vocabulary, as the runner runs it after a decode step: greedy rows,
// draws and filtered draws (top-k 40, top-p 0.95: the models' generation_config defaults), the
// rows laid out plainly (one GPU) and as a TP8 group gathers them
// ([8, rows, 25,008]). Logits uniform in [-10, 10]; input sets rotate so that, over the sets, the
// rows read exceed 4x the L2. Floor: the rows' bytes read once at the measured copy rate.
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "kernels/bench/bench.h"
#include "kernels/bench/harness.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cuda_ops.h"

namespace sieve::kernels_bench {

namespace {
constexpr const char* kSample = "sample";
}

void run_sample_rows(const Options& opt, const Env& env, const std::function<void(const Row&)>& on_row,
                     cudaStream_t st) {
  if (!opt.rows.empty() && std::string(kSample).find(opt.rows) == std::string::npos) return;
  const int64_t V = 200064;
  const int iters = std::max(50, opt.iters);
  const double bw = env.copy_gbps * 1e9, l2 = env.l2_mb * 1048576.0;
  for (int64_t rows : {int64_t(32), int64_t(128)}) {
    const double bytes = double(rows * V) * 4;
    const int sets = std::max(1, int(4 * l2 / bytes) + 1);
    std::vector<DevPtr> logits;
    for (int s = 0; s < sets; ++s) {
      logits.push_back(dev(size_t(rows * V) * 4));
      fill(logits.back()->p, 2, size_t(rows * V), 500 + uint64_t(s), 20.f, -10.f);
    }
    auto ids = dev(size_t(rows) * 4);
    for (int shards : {1, 8}) {
      for (auto mode : {ops::SampleMode::Greedy, ops::SampleMode::Draw, ops::SampleMode::Filtered}) {
        const std::string shape = std::to_string(rows) + " rows x " + std::to_string(V) +
                                  (shards > 1 ? " tp8 shards" : "") +
                                  (mode == ops::SampleMode::Greedy ? ", greedy"
                                   : mode == ops::SampleMode::Draw ? ", draw"
                                                                   : ", top-k 40 top-p 0.95");
        if (!opt.filter.empty() && (std::string(kSample) + " " + shape + " f32").find(opt.filter) == std::string::npos)
          continue;
        std::vector<ops::SampleRow> rr(static_cast<size_t>(rows));
        for (int64_t r = 0; r < rows; ++r) {
          rr[size_t(r)] = {1.0 / 0.8, (double(r) + 0.5) / double(rows), int32_t(mode), 0};
          // (The models' generation_config defaults.)
          if (mode == ops::SampleMode::Filtered) {
            rr[size_t(r)].top_k = 40;
            rr[size_t(r)].top_p = 0.95;
          }
        }
        auto d_rows = upload(rr);
        std::vector<ops::SampleParams> ps(static_cast<size_t>(sets));
        for (int s = 0; s < sets; ++s) {
          ops::SampleParams& p = ps[size_t(s)];
          p.logits = static_cast<const float*>(logits[size_t(s)]->p);
          p.rows = rows;
          p.vocab = V;
          p.shards = shards;
          p.row = d_rows->as<ops::SampleRow>();
          p.out = ids->as<int32_t>();
          p.any_filtered = mode == ops::SampleMode::Filtered;  // as the runner says it
        }
        auto fn = [&](int s, cudaStream_t stream) { cuda::run_sample(ps[size_t(s)], stream); };
        fn(0, st);  // sizes the op's scratch outside the graph capture
        cuda_check(cudaStreamSynchronize(st), "bench sample");
        Row r{kSample, shape, "f32", "eager", 0, bytes / bw * 1e6, "bytes"};
        r.runs = iters, r.input_sets = sets;
        r.us = time_it(iters, sets, fn, false, st);
        on_row(r);
        r.mode = "graph";
        r.us = time_it(iters, sets, fn, true, st);
        on_row(r);
      }
    }
  }
}

}  // namespace sieve::kernels_bench
