// Turns a StepPlan into the model's step inputs (kernels/ops.h "Conventions"): positions, slot
// mapping, query start offsets, sequence lengths, padded block tables and the rows whose logits
// are sampled. Host arrays only; a device backend copies them as they are.
#pragma once

#include "engine/scheduler.h"
#include "model/model.h"

namespace sieve::engine {

// Logits rows, in plan order: every token's of a sequence with all_logits, else the last
// token's of a sequence with sample. `row_seq[i]` receives the plan index of row i's sequence.
model::StepInputs build_step_inputs(const StepPlan& plan, int block_size,
                                    std::vector<int>* row_seq = nullptr);

}  // namespace sieve::engine
