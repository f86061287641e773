#include "engine/runner.h"

#include "core/error.h"

namespace sieve::engine {

model::StepInputs build_step_inputs(const StepPlan& plan, int block_size,
                                    std::vector<int>* row_seq) {
  model::StepInputs in;
  const size_t num_seqs = plan.seqs.size();
  int max_blocks = 1;
  for (const auto& s : plan.seqs) max_blocks = std::max<int>(max_blocks, int(s.block_table.size()));
  in.max_blocks_per_seq = max_blocks;
  in.query_start_loc.reserve(num_seqs + 1);
  in.seq_lens.reserve(num_seqs);
  in.block_tables.assign(num_seqs * size_t(max_blocks), 0);
  in.token_ids.reserve(size_t(plan.num_tokens));
  in.positions.reserve(size_t(plan.num_tokens));
  in.slot_mapping.reserve(size_t(plan.num_tokens));
  if (row_seq) row_seq->clear();
  in.query_start_loc.push_back(0);
  for (size_t si = 0; si < num_seqs; ++si) {
    const ScheduledSeq& s = plan.seqs[si];
    const int64_t n = int64_t(s.token_ids.size());
    const int64_t end = s.start_pos + n;
    SIEVE_CHECK(n > 0, "empty scheduled sequence");
    SIEVE_CHECK(int64_t(s.block_table.size()) * block_size >= end,
                "block table too short for the step");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s.start_pos + i;
      in.token_ids.push_back(s.token_ids[size_t(i)]);
      in.positions.push_back(int32_t(pos));
      in.slot_mapping.push_back(int64_t(s.block_table[size_t(pos / block_size)]) * block_size +
                                pos % block_size);
    }
    in.query_start_loc.push_back(int32_t(in.token_ids.size()));
    in.seq_lens.push_back(int32_t(end));
    std::copy(s.block_table.begin(), s.block_table.end(),
              in.block_tables.begin() + long(si * size_t(max_blocks)));
    const int64_t rows = s.all_logits ? n : (s.sample ? 1 : 0);
    for (int64_t i = n - rows; i < n; ++i) {
      in.logits_indices.push_back(int32_t(in.token_ids.size() - size_t(n) + size_t(i)));
      if (row_seq) row_seq->push_back(int(si));
    }
  }
  return in;
}

}  // namespace sieve::engine
