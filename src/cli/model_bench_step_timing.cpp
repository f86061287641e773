#include "cli/model_bench_step_timing.h"

#include <random>
#include <span>

#include "engine/sampler.h"

namespace sieve::cli::step_timing {

StepTimes time_steps(engine::Runner& r, const engine::StepInputs& in, const engine::DraftPlan* plan, long long iters,
                     Marks& marks, engine::HostLogits& logits, const std::vector<ops::SampleRow>* sample) {
  using Phase = engine::Runner::Phase;
  std::vector<double> step, lg, draft, propose, op;
  engine::StepOutput sampled;
  std::vector<std::vector<int32_t>> drafts;
  for (long long i = 0; i < iters + 3; ++i) {
    marks.clear();
    int up = -1, comp = -1, samp = -1;
    std::vector<int> pass_marks;
    clock_type::time_point t_comp, t_done;
    r.set_phase_observer([&](Phase p) {
      if (p == Phase::Uploaded) up = marks.mark();
      if (p == Phase::Computed) {
        comp = marks.mark();
        t_comp = clock_type::now();
      }
      if (p == Phase::Sampled) samp = marks.mark();
      if (p == Phase::Done) t_done = clock_type::now();
      if (p == Phase::DraftUploaded || p == Phase::DraftComputed) pass_marks.push_back(marks.mark());
    });
    double prop = 0;
    try {
      if (sample)
        r.run(in, *sample, sampled);
      else
        r.run(in, logits);
      const auto t0 = clock_type::now();
      if (plan) r.propose(*plan, drafts);
      prop = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
    } catch (...) {
      r.set_phase_observer({});
      throw;
    }
    r.set_phase_observer({});
    if (i < 3) continue;
    const double fwd = marks.ms(up, comp);
    step.push_back(fwd);
    lg.push_back(std::max(0.0, std::chrono::duration<double, std::milli>(t_done - t_comp).count() - fwd));
    double d = 0;
    for (size_t k = 0; k + 1 < pass_marks.size(); k += 2) d += marks.ms(pass_marks[k], pass_marks[k + 1]);
    draft.push_back(d);
    propose.push_back(prop);
    op.push_back(samp >= 0 ? marks.ms(comp, samp) : 0.0);
    // (On the CPU the op runs before the Computed mark's clock reads on: its time is the op's.)
    if (sample) lg.back() = std::max(lg.back(), op.back());
  }
  return {median(step), median(lg), median(draft), median(propose), median(op)};
}

// Host time of the engine's draws over `seqs` sequences of `rows` logits rows each (one request per
// worker, every row drawn as a plain token is): the median of 5 rounds.
double sampling_ms(engine::Workers& workers, const engine::HostLogits& logits, int64_t vocab, long long seqs,
                   int rows, const engine::SamplingParams& sp) {
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = clock_type::now();
    workers.run(seqs, [&](int64_t s) {
      std::mt19937_64 g{uint64_t(s)};
      for (int j = 0; j < rows; ++j)
        engine::sample_token(std::span<const float>(logits.data() + size_t((s * rows + j) * vocab), size_t(vocab)), sp,
                             {}, 0, {}, g);
    });
    ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
  }
  return median(ms);
}

}  // namespace sieve::cli::step_timing
