// Step execution. The runner turns a step's host arrays into the model's device inputs (one copy
// into one buffer), runs the model's forward on its own stream (a decode step as a CUDA graph,
// captured on first use per padded batch and context bucket), and brings the requested logits
// rows back to the host for sampling. What runs is the scheduler's decision (StepPlan); what a
// step computes is the model's (model/model.h).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <string>
#include <utility>
#include <vector>

#include "engine/scheduler.h"
#include "kernels/memory.h"
#include "kernels/ops.h"
#include "model/model.h"
#include "spec/eagle3.h"

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
  // EAGLE3 draft passes only: row i reads row hidden_rows[i] of the previous pass's output, and
  // the draft's logits are those of rows draft_rows, in order.
  std::vector<int32_t> hidden_rows;
  std::vector<int32_t> draft_rows;
};

// What the EAGLE3 draft does after a step (Runner::propose). The first pass runs over the rows
// of the step that just ran, each with the token after its position; `slots` [num_tokens] says
// where each row's draft K/V goes (-1: nowhere, for draft rows the target rejected). Sequence
// i of `seqs` then gets K draft tokens: the first from the first pass's row `last_row` (its last
// kept position), the next K - 1 from one-row passes at positions first_pos, first_pos + 1, ...
// over `block_table` (which covers them).
struct DraftPlan {
  std::vector<int32_t> next_tokens;  // [num_tokens of the step]
  std::vector<int64_t> slots;        // [num_tokens of the step]
  struct Seq {
    int step_seq = 0;  // its index among the step's sequences
    int32_t last_row = 0;
    int64_t first_pos = 0;
    std::vector<int32_t> block_table;
  };
  std::vector<Seq> seqs;
  int num_tokens = 0;  // K
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
// The same for steps of q tokens per sequence (verification steps, the draft's passes): each
// added sequence holds q tokens at positions 0..q-1 of `pad_block`; logits (when `in` has any)
// for every row in order; hidden_rows of added rows 0, draft_rows of added sequences their first row.
StepInputs pad_uniform_step(const StepInputs& in, int q, int rows, int width, int32_t pad_block, int block_size);

struct RunnerOptions {
  // CUDA: decode steps (one new token per sequence) of up to max_graph_batch sequences run as
  // CUDA graphs, captured on first use per (padded batch, context bucket); enforce_eager
  // launches every kernel of every step instead (vLLM's --enforce-eager).
  bool enforce_eager = false;
  int max_graph_batch = 256;
  // The tokens of rows the engine asks for (StepOutput) and the EAGLE3 draft's argmax come from
  // the sample op on the model's device, and only the ids and the rows the host needs are copied
  // back; off, every row comes to the host and the host picks the tokens (tests, A/B benchmarks).
  bool device_sampling = true;
};

// What the CUDA-graph decode path did so far.
struct GraphStats {
  int64_t captured = 0;    // graphs captured (one per padded batch size and context bucket)
  int64_t replayed = 0;    // decode steps that ran as a graph replay
  int64_t eager = 0;       // decode steps that ran eagerly (first use of a shape, or graphs off)
  std::string off_reason;  // why graphs are off ("" while they are on or were never tried)
};

// A call of a tensor-parallel group's leading runner that every other rank repeats on its own
// runner: plain data, so that it also travels to the ranks of other machines.
struct RankCommand {
  enum class Kind : uint8_t { Run, AllocateCaches, ReleaseCaches, Reserve };
  Kind kind = Kind::Run;
  StepInputs in;                          // Run
  model::CacheOptions caches;             // AllocateCaches
  int64_t max_tokens = 0, max_seqs = 0;   // Reserve
};

// The other ranks of a tensor-parallel group (engine/rank_group.h). The leading runner hands each
// call it gets to them and runs its own part at the same time, so that their collectives meet.
class Followers {
 public:
  virtual ~Followers() = default;
  // Starts `c` on every other rank's runner and returns at once.
  virtual void start(const RankCommand& c) = 0;
  // Waits until they are done. `leader_error` (non-empty: the leader's part failed) breaks the
  // group first, so that no rank waits for the leader. Throws Error with the first failure of
  // any rank.
  virtual void finish(const std::string& leader_error) = 0;
  // Why the group broke ("" while it works); a broken group runs nothing more.
  virtual std::string broken() const = 0;
};


// A step's logits on the host in page-locked memory when the device is a GPU, so that their copy
// runs at the link's rate (32 rows of a 200,064-token vocabulary are 25.6 MB a step; to pageable
// memory the copy ran at ~15 GB/s on an H100). Grows, never shrinks; contents are not kept.
class HostLogits {
 public:
  HostLogits() = default;
  ~HostLogits();
  HostLogits(const HostLogits&) = delete;
  HostLogits& operator=(const HostLogits&) = delete;
  float* data() const { return p_; }
  size_t size() const { return n_; }
  // Room for n floats, allocated for copies from `device`.
  float* resize(const Device& device, size_t n);

 private:
  float* p_ = nullptr;
  size_t n_ = 0, cap_ = 0;
  Device device_;  // the device the copies come from
  Device memory_;  // what allocated p_ (the CPU: ordinary memory)
};

// A step's results for the engine (Runner::run with row requests): for logits row i (in
// logits_indices order) the sample op's token, or its logits on the host.
struct StepOutput {
  std::vector<int32_t> tokens;    // [rows] the op's token; -1: none (the row is on the host)
  std::vector<int32_t> host_row;  // [rows] its row in `logits`; -1: not on the host
  HostLogits logits;              // [rows on the host, vocab], compacted
  int64_t vocab = 0;
  // Row i's logits (host_row[i] >= 0).
  const float* row(size_t i) const { return logits.data() + size_t(host_row[i]) * size_t(vocab); }
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
  // The same into host memory that the device copies to at the link's rate.
  void run(const StepInputs& in, HostLogits& logits);
  // The engine's: rows[i] says what logits row i needs (ops::SampleRow; mode Skip: its full
  // logits on the host). After the forward, the sample op picks the token of every other row on
  // the model's device; only the ids and the rows the host needs are copied back: the Skip rows
  // and the rows the op left at -1 (no mass: the host's general path decides). With
  // device_sampling off every row comes to the host.
  void run(const StepInputs& in, const std::vector<ops::SampleRow>& rows, StepOutput& out);
  const RunnerOptions& options() const { return opts_; }

  // The model's caches (Model::allocate_caches / release_caches), on every rank of a group.
  void allocate_caches(const model::CacheOptions& co);
  void release_caches();

  // Runs `c` as the call it describes (a follower's part of the leader's call).
  void apply(const RankCommand& c);

  // Tensor parallelism: this runner leads the ranks of `f` (RankGroup sets it; null: alone).
  void set_followers(Followers* f) { followers_ = f; }
  // Why this runner's tensor-parallel group broke; "" while it works (or when alone). A broken
  // group fails every later step: the process serving it should stop.
  std::string broken() const { return followers_ ? followers_->broken() : std::string(); }

  // Instrumentation (sieve bench step): called on the host as run() passes the phases of a
  // step, in order: Begin (checked), Uploaded (inputs on the device), Computed (the forward or
  // graph replay enqueued on stream()), Sampled (run with row requests: the sample op enqueued,
  // when any row has one), Done (logits or tokens on the host); and as propose() passes each of
  // the draft's passes: DraftUploaded, DraftComputed (the pass enqueued).
  enum class Phase { Begin, Uploaded, Computed, Sampled, Done, DraftUploaded, DraftComputed };
  void set_phase_observer(std::function<void(Phase)> fn) { phase_ = std::move(fn); }

  // EAGLE3: runs `draft` after every step (propose()); the target then also writes the aux hidden
  // states the draft reads. Null: none.
  void set_draft(spec::Eagle3Draft* draft);
  // Throws Error when a draft cannot run here (a tensor-parallel group: the draft reads the
  // target's embedding and hidden states, which its ranks hold in shards).
  void check_draft_allowed() const;
  spec::Eagle3Draft* draft() const { return draft_; }
  // After run(): the draft's passes of `plan` (see DraftPlan); drafts[i] receives the K draft
  // tokens (target ids) of plan.seqs[i].
  void propose(const DraftPlan& plan, std::vector<std::vector<int32_t>>& drafts);

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
    uint64_t model_epoch = 0, logits_epoch = 0, draft_epoch = 0;  // at capture
    uint64_t used = 0;                           // graph_clock_ at the last capture or replay
  };

  Bounds check(const StepInputs& in) const;
  // Copies the step's arrays into `dst` (one copy) and describes them for the model. `pinned`:
  // dst is a captured graph's, so it must not move.
  model::StepView upload(const StepInputs& in, const Bounds& b, Buffer& dst, bool pinned);
  float* logits_rows(int64_t rows);
  // Where a step's logits go: returns room for n floats on the host.
  using LogitsSink = std::function<float*(size_t n)>;
  // What a step does with its logits once the forward is enqueued: `rows` real rows, in a
  // buffer laid out for `layout_rows` (a graph's padded step).
  using LogitsReader = std::function<void(int64_t rows, int64_t layout_rows)>;
  void read_logits(int64_t rows, int64_t layout_rows, const LogitsSink& out);
  // Rows [r0, r1) of the logits (layout_rows of them) into `dst` [r1 - r0, vocab].
  void copy_rows(int64_t r0, int64_t r1, int64_t layout_rows, float* dst);
  // The sample op over the step's logits (rows_dev_ uploaded), then the ids and the rows the host
  // needs into `out`.
  void sample_rows(int64_t rows, int64_t layout_rows, const std::vector<ops::SampleRow>& req, StepOutput& out);
  void run_sink(const StepInputs& in, const LogitsReader& read);
  // Runs `local` here and `job` on the followers at the same time (`local` alone without any).
  void lockstep(const RankCommand& c, const std::function<void()>& local);
  void run_here(const StepInputs& in, const LogitsReader& read);
  // Runs a decode or verification step as a graph replay (or its first, eager run and capture).
  // False for other steps, and for steps that graphs do not take (counted as eager).
  bool graph_step(const StepInputs& in, const Bounds& b, const LogitsReader& read);
  // One of the draft's passes, as a graph when it has q tokens per sequence (padded; `kind`: 1 the
  // first pass, 3 the same without logits, 2 the next ones; `extra` tells passes of one layout
  // apart), else eagerly. Returns the rows of draft logits.
  int64_t draft_pass(const StepInputs& in, const Bounds& b, int kind, int64_t extra, bool padded,
                     const float* aux, int64_t prev_rows);
  // The padded shape of q-token sequences for graphs: (rows, context bucket keys); rows 0 when
  // graphs do not take it.
  std::pair<int, int64_t> graph_shape(int num_seqs, int max_seq) const;
  // Replays the graph of `key` over `p` (or runs `fwd` eagerly once and captures it).
  bool run_graph(const std::tuple<int, int, int, int, int64_t>& key, const StepInputs& p, const Bounds& pb,
                 const std::function<void(const model::StepView&)>& fwd);

  // The draft's logits rows mapped to target ids by their argmax (ties to the lower draft id).
  void draft_argmax(int64_t rows, std::vector<int32_t>& out);

  model::Model& m_;
  Followers* followers_ = nullptr;
  spec::Eagle3Draft* draft_ = nullptr;
  Buffer aux_;                // [n_aux, tokens, hidden] fp32, the target's aux hidden states
  Buffer draft_logits_;       // [rows, draft vocab] fp32
  StepInputs last_;           // the step run() ran last, as it ran (padded for graphs)
  Bounds last_bounds_;
  bool last_padded_ = false;    // last_ is a graph's padded step
  std::vector<float> draft_host_;
  const int32_t* hidden_rows_dev_ = nullptr;  // upload()'s copies of hidden_rows and draft_rows
  const int32_t* draft_rows_dev_ = nullptr;
  RunnerOptions opts_;
  Device dev_;
  ops::Stream stream_;
  Buffer inputs_;               // eager steps' device inputs
  std::vector<uint8_t> stage_;  // their host side
  std::vector<float> shards_;   // logits in vocabulary shards, before they are put in rows
  Buffer sample_rows_;          // [rows] ops::SampleRow of the sample op
  Buffer sample_ids_;           // [rows] int32 its tokens
  std::vector<ops::SampleRow> sample_stage_;
  std::vector<int32_t> ids_host_;
  Buffer d2t_;                  // the draft's draft-to-target map, for draft_argmax's op
  const spec::Eagle3Draft* d2t_of_ = nullptr;
  int64_t greedy_rows_ = 0;     // sample_rows_ holds that many Greedy rows (draft_argmax's)
  Buffer logits_;               // [rows, vocab] fp32, every step's (captured ones too)
  uint64_t logits_epoch_ = 0;   // bumped when logits_ is replaced
  // By (kind: 0 target / 1 draft's first pass / 2 its next ones, padded sequences, tokens per
  // sequence, context bucket, kind-specific extent).
  std::map<std::tuple<int, int, int, int, int64_t>, StepGraph> graphs_;
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
