// `sieve bench step`'s timing (model_bench_step.cpp): marks on the device's timeline, a step run
// again and again on a runner as serving runs it, and the host's draws for comparison.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "core/error.h"
#include "engine/runner.h"
#include "engine/workers.h"
#include "kernels/ops.h"
#ifdef SIEVE_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sieve::cli::step_timing {

using clock_type = std::chrono::steady_clock;

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Time marks on the device's timeline: CUDA events on a stream, or host clock readings on the CPU
// (whose ops run when called).
class Marks {
 public:
  Marks(const Device& dev, void* stream) : cuda_(dev.is_cuda()), stream_(stream) {}
  ~Marks() {
#ifdef SIEVE_HAVE_CUDA
    for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
  }
  void clear() { used_ = 0; }
  int mark() {
    if (!cuda_) {
      host_.resize(size_t(used_) + 1);
      host_[size_t(used_)] = clock_type::now();
      return used_++;
    }
#ifdef SIEVE_HAVE_CUDA
    if (used_ == int(events_.size())) {
      cudaEvent_t e = nullptr;
      if (cudaEventCreate(&e) != cudaSuccess) throw Error("cudaEventCreate failed");
      events_.push_back(e);
    }
    cudaEventRecord(static_cast<cudaEvent_t>(events_[size_t(used_)]), static_cast<cudaStream_t>(stream_));
#endif
    return used_++;
  }
  // Milliseconds between two marks (after the device has passed both).
  double ms(int a, int b) const {
    if (!cuda_) return std::chrono::duration<double, std::milli>(host_[size_t(b)] - host_[size_t(a)]).count();
    float t = 0;
#ifdef SIEVE_HAVE_CUDA
    cudaEventSynchronize(static_cast<cudaEvent_t>(events_[size_t(b)]));
    cudaEventElapsedTime(&t, static_cast<cudaEvent_t>(events_[size_t(a)]), static_cast<cudaEvent_t>(events_[size_t(b)]));
#endif
    return double(t);
  }

 private:
  bool cuda_;
  void* stream_;
  int used_ = 0;
  std::vector<void*> events_;
  std::vector<clock_type::time_point> host_;
};

// Times of a step run again and again on a runner (medians over the timed runs).
struct StepTimes {
  double step_ms = 0;     // the forward on the device, between the Uploaded and Computed marks
  double logits_ms = 0;   // host time from the forward's launch to the logits (or ids) on the host, less it
  double draft_ms = 0;    // the draft's passes on the device (between their marks, summed)
  double propose_ms = 0;  // host time of Runner::propose: the passes and their rows' argmax, ids to the host
  double op_ms = 0;       // with row requests: the sample op on the device (events around it)
};

// Runs `in` iters + 3 times on `r` (the first use runs eagerly and captures a CUDA graph, then warm
// replays) and times the last iters; with `plan`, the draft's passes after each step as well.
// With `sample` (a request per logits row) the step runs as the engine runs it: the sample op on
// the device and the ids (and rows the host needs) to the host; logits_ms is then that part.
StepTimes time_steps(engine::Runner& r, const engine::StepInputs& in, const engine::DraftPlan* plan, long long iters,
                     Marks& marks, engine::HostLogits& logits, const std::vector<ops::SampleRow>* sample = nullptr);

// Host time of the engine's draws over `seqs` sequences of `rows` logits rows each (one request per
// worker, every row drawn with `params` as sample_token draws it): the median of 5 rounds.
double sampling_ms(engine::Workers& workers, const engine::HostLogits& logits, int64_t vocab, long long seqs,
                   int rows, const engine::SamplingParams& params = {});

}  // namespace sieve::cli::step_timing
