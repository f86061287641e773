// Step execution. The runner turns a step's host arrays into the model's device inputs (one copy
// into one buffer), runs the model's forward on its own stream (a decode step as a CUDA graph,
// captured on first use per padded batch and context bucket), and brings the requested logits
// rows back to the host for sampling. What runs is the scheduler's decision (StepPlan); what a
// step computes is the model's (model/model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"

namespace sieve::engine {

// One engine step as host arrays (kernels/ops.h, "Conventions"). Sequence s owns tokens
// [query_start_loc[s], query_start_loc[s+1]); after the step it has seq_lens[s] tokens in the
// cache.
struct StepInputs {
  std::vector<int32_t> token_ids;        // [num_tokens]
  std::vector<int32_t> positions;        // [num_tokens]
  std::vector<int64_t> slot_mapping;     // [num_tokens] physical block * block_size + offset
  std::vector<int32_t> query_start_loc;  // [num_seqs + 1]
  std::vector<int32_t> seq_lens;         // [num_seqs]
  std::vector<int32_t> block_tables;     // [num_seqs, max_blocks_per_seq], unused entries 0
  int max_blocks_per_seq = 0;
  std::vector<int32_t> logits_indices;   // token rows whose logits are wanted, in output order
};

// Logits rows, in plan order: every token's of a sequence with all_logits, else the last
// token's of a sequence with sample. `row_seq[i]` receives the plan index of row i's sequence.
StepInputs build_step_inputs(const StepPlan& plan, int block_size, std::vector<int>* row_seq = nullptr);

// The decode step `in` (one new token per sequence, a logit row for each in order) padded to
// `rows` sequences with tables of `width` blocks: each added sequence holds one token (id 0,
// position 0, slot 0 of `pad_block`), and table entries past a sequence's blocks are
// `pad_block`. The real rows' results do not change. CUDA graphs replay a step captured at
// `rows` sequences for any batch up to it (padding block: a cache block no request owns).
StepInputs pad_decode_step(const StepInputs& in, int rows, int width, int32_t pad_block, int block_size);

struct RunnerOptions {
  // CUDA: decode steps (one new token per sequence) of up to max_graph_batch sequences run as
  // CUDA graphs, captured on first use per (padded batch, context bucket); enforce_eager
  // launches every kernel of every step instead (vLLM's --enforce-eager).
  bool enforce_eager = false;
  int max_graph_batch = 256;
};

// What the CUDA-graph decode path did so far.
struct GraphStats {
  int64_t captured = 0;    // graphs captured (one per padded batch size and context bucket)
  int64_t replayed = 0;    // decode steps that ran as a graph replay
  int64_t eager = 0;       // decode steps that ran eagerly (first use of a shape, or graphs off)
  std::string off_reason;  // why graphs are off ("" while they are on or were never tried)
};

class Runner {
 public:
  explicit Runner(model::Model& m, RunnerOptions opts = {});
  ~Runner();
  Runner(const Runner&) = delete;
  Runner& operator=(const Runner&) = delete;

  model::Model& model() const { return m_; }
  const GraphStats& graph_stats() const { return graph_stats_; }
  // The stream the model's kernels run on (null on the CPU).
  const ops::Stream& stream() const { return stream_; }

  // Checks `in` against the model's vocabulary and caches (an Error names what is wrong), runs
  // it, and fills `logits` [in.logits_indices.size(), vocab] on the host.
  void run(const StepInputs& in, std::vector<float>& logits);

  // Instrumentation (sieve bench step): called on the host as run() passes the phases of a
  // step, in order: Begin (checked), Uploaded (inputs on the device), Computed (the forward or
  // graph replay enqueued on stream()), Done (logits on the host).
  enum class Phase { Begin, Uploaded, Computed, Done };
  void set_phase_observer(std::function<void(Phase)> fn) { phase_ = std::move(fn); }

  // Allocates now the model's activations and the logits rows of a step of up to max_tokens
  // tokens and max_seqs sequences (run() grows them on demand otherwise), so that a GPU's free
  // memory measured afterwards leaves them out of the cache budget.
  void reserve(int64_t max_tokens, int64_t max_seqs);

 private:
  // Host bounds of a step, found while checking it: the kernels' grids come from these.
  struct Bounds {
    int max_seq = 0, max_query = 0, max_position = 0;
  };
  // A captured decode step and the inputs buffer its kernels read.
  struct StepGraph {
    Graph graph;
    Buffer inputs;
    uint64_t model_epoch = 0, logits_epoch = 0;  // at capture
    uint64_t used = 0;                           // graph_clock_ at the last capture or replay
  };

  Bounds check(const StepInputs& in) const;
  // Copies the step's arrays into `dst` (one copy) and describes them for the model. `pinned`:
  // dst is a captured graph's, so it must not move.
  model::StepView upload(const StepInputs& in, const Bounds& b, Buffer& dst, bool pinned);
  float* logits_rows(int64_t rows);
  void read_logits(int64_t rows, std::vector<float>& logits) const;
  // Runs a decode step as a graph replay (or its first, eager run and capture). False for other
  // steps, and for decode steps that graphs do not take (counted as eager).
  bool graph_step(const StepInputs& in, const Bounds& b, std::vector<float>& logits);

  model::Model& m_;
  RunnerOptions opts_;
  Device dev_;
  ops::Stream stream_;
  Buffer inputs_;               // eager steps' device inputs
  std::vector<uint8_t> stage_;  // their host side
  Buffer logits_;               // [rows, vocab] fp32, every step's (captured ones too)
  uint64_t logits_epoch_ = 0;   // bumped when logits_ is replaced
  std::map<std::pair<int, int>, StepGraph> graphs_;  // by (padded rows, context bucket)
  uint64_t graph_clock_ = 0;
  GraphStats graph_stats_;
  std::function<void(Phase)> phase_;
  void phase(Phase p) const {
    if (phase_) phase_(p);
  }
};

// One prefill step of `tokens` tokens (one sequence, through a temporary cache of just enough
// blocks) before serving: it runs every kernel the model needs, so an op the device lacks fails
// at start, and it leaves the kernels' grow-only workspaces allocated, so a GPU's free memory
// measured afterwards leaves them out of the cache budget. The temporary cache is freed at the
// end; the caller allocates the real one.
void warm_up(Runner& r, DType kv_dtype, DType index_dtype, int64_t tokens);

}  // namespace sieve::engine
