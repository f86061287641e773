#include "engine/runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"
#include "kernels/cpu/cpu_ops.h"
#include "spec/config.h"

namespace sieve::engine {

StepInputs build_step_inputs(const StepPlan& plan, int block_size, std::vector<int>* row_seq) {
  StepInputs in;
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
    SIEVE_CHECK(int64_t(s.block_table.size()) * block_size >= end, "block table too short for the step");
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = s.start_pos + i;
      in.token_ids.push_back(s.token_ids[size_t(i)]);
      in.positions.push_back(int32_t(pos));
      in.slot_mapping.push_back(int64_t(s.block_table[size_t(pos / block_size)]) * block_size + pos % block_size);
    }
    in.query_start_loc.push_back(int32_t(in.token_ids.size()));
    in.seq_lens.push_back(int32_t(end));
    std::copy(s.block_table.begin(), s.block_table.end(), in.block_tables.begin() + long(si * size_t(max_blocks)));
    const int64_t rows = s.all_logits ? n : (s.sample ? 1 + s.num_draft : 0);
    for (int64_t i = n - rows; i < n; ++i) {
      in.logits_indices.push_back(int32_t(in.token_ids.size() - size_t(n) + size_t(i)));
      if (row_seq) row_seq->push_back(int(si));
    }
  }
  return in;
}

StepInputs pad_uniform_step(const StepInputs& in, int q, int rows, int width, int32_t pad_block, int block_size) {
  const size_t ns = in.seq_lens.size();
  SIEVE_CHECK(q >= 1 && in.token_ids.size() == ns * size_t(q), "pad_uniform_step: not q tokens per sequence");
  SIEVE_CHECK(size_t(rows) >= ns, "pad_uniform_step: fewer rows than sequences");
  SIEVE_CHECK(q <= block_size, "pad_uniform_step: more tokens per sequence than a block holds");
  const size_t n = size_t(rows) * size_t(q);
  StepInputs p;
  p.token_ids = in.token_ids;
  p.token_ids.resize(n, 0);
  p.positions = in.positions;
  p.slot_mapping = in.slot_mapping;
  for (size_t t = in.token_ids.size(); t < n; ++t) {
    const int i = int(t % size_t(q));
    p.positions.push_back(i);
    p.slot_mapping.push_back(int64_t(pad_block) * block_size + i);
  }
  p.seq_lens = in.seq_lens;
  p.seq_lens.resize(size_t(rows), q);
  p.max_blocks_per_seq = width;
  p.block_tables.assign(size_t(rows) * size_t(width), pad_block);
  for (size_t s = 0; s < ns; ++s) {
    const int blocks = (in.seq_lens[s] + block_size - 1) / block_size;
    SIEVE_CHECK(blocks <= width && blocks <= in.max_blocks_per_seq, "pad_uniform_step: table too narrow");
    std::copy_n(in.block_tables.begin() + long(s * size_t(in.max_blocks_per_seq)), blocks,
                p.block_tables.begin() + long(s * size_t(width)));
  }
  for (int i = 0; i <= rows; ++i) p.query_start_loc.push_back(i * q);
  // Logits: every row, in order (a decode step's or a verification step's).
  if (!in.logits_indices.empty())
    for (size_t i = 0; i < n; ++i) p.logits_indices.push_back(int32_t(i));
  // Draft passes: padding rows read row 0 and give a (discarded) draft row each.
  if (!in.hidden_rows.empty()) {
    p.hidden_rows = in.hidden_rows;
    p.hidden_rows.resize(n, 0);
  }
  if (!in.draft_rows.empty()) {
    p.draft_rows = in.draft_rows;
    p.draft_rows.resize(size_t(rows), 0);
    for (size_t i = ns; i < size_t(rows); ++i) p.draft_rows[i] = int32_t(i * size_t(q));
  }
  return p;
}

StepInputs pad_decode_step(const StepInputs& in, int rows, int width, int32_t pad_block, int block_size) {
  SIEVE_CHECK(in.seq_lens.size() == in.token_ids.size() && in.logits_indices.size() == in.token_ids.size(),
              "pad_decode_step: not a decode step");
  return pad_uniform_step(in, 1, rows, width, pad_block, block_size);
}

// ---------------------------------------------------------------------------------------------
// Runner

namespace {

constexpr size_t kMaxGraphs = 64;

// Padded batch sizes: 1, 2, 4, 8, then multiples of 8 (vLLM's capture sizes).
int graph_rows(int n) { return n <= 4 ? (n <= 1 ? 1 : n <= 2 ? 2 : 4) : (n + 7) / 8 * 8; }

// q when every sequence has q new tokens and every token has its logits row, in order (decode
// steps: q = 1; verification steps: q = K + 1); 0 otherwise.
int uniform_q(const StepInputs& in) {
  const size_t n = in.token_ids.size(), ns = in.seq_lens.size();
  if (n == 0 || ns == 0 || n % ns != 0 || in.logits_indices.size() != n) return 0;
  const int q = int(n / ns);
  for (size_t i = 0; i < n; ++i)
    if (in.logits_indices[i] != int32_t(i)) return 0;
  for (size_t s = 0; s <= ns; ++s)
    if (in.query_start_loc[s] != int32_t(s) * q) return 0;
  return q;
}

// A draft pass's layout: q tokens per sequence (no logits rows of the target).
int uniform_draft_q(const StepInputs& in) {
  const size_t n = in.token_ids.size(), ns = in.seq_lens.size();
  if (n == 0 || ns == 0 || n % ns != 0) return 0;
  const int q = int(n / ns);
  for (size_t s = 0; s <= ns; ++s)
    if (in.query_start_loc[s] != int32_t(s) * q) return 0;
  return q;
}

// b holding at least `bytes` (at least 1), replaced (contents lost) when smaller; true if it was.
bool grow(Buffer& b, const Device& dev, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (b.bytes() >= bytes) return false;
  b = Buffer(dev, bytes + bytes / 4);
  return true;
}

// Whether any row is picked by the sample op (the others' logits go to the host).
bool any_on_device(const std::vector<ops::SampleRow>& rows) {
  for (const auto& r : rows)
    if (r.mode != int32_t(ops::SampleMode::Skip)) return true;
  return false;
}

}  // namespace

Runner::Runner(model::Model& m, RunnerOptions opts) : m_(m), opts_(opts), dev_(m.device()) {
  stream_.device = dev_;
  // CUDA: a stream of the runner's own (graphs are captured from it), ordered with the
  // synchronous copies of kernels/memory.h.
  use_device(dev_);
  stream_.cuda_stream = create_stream(dev_);
}

Runner::~Runner() {
  graphs_.clear();
  if (stream_.cuda_stream) {
    try {
      device_synchronize(dev_);
    } catch (...) {
    }
    destroy_stream(dev_, stream_.cuda_stream);
  }
}

void Runner::reserve(int64_t max_tokens, int64_t max_seqs) {
  RankCommand c;
  c.kind = RankCommand::Kind::Reserve;
  c.max_tokens = max_tokens;
  c.max_seqs = max_seqs;
  lockstep(c, [&] {
             const int64_t rows = std::min(max_tokens, max_seqs);
             use_device(dev_);
             m_.reserve_step(max_tokens, rows);
             logits_rows(rows);
           });
}

Runner::Bounds Runner::check(const StepInputs& in) const {
  const ModelConfig& cfg = m_.config();
  const size_t n = in.token_ids.size();
  const size_t ns = in.seq_lens.size();
  if (in.positions.size() != n || in.slot_mapping.size() != n)
    throw Error("step inputs: positions and slot_mapping must have one entry per token");
  if (in.query_start_loc.size() != ns + 1 || in.query_start_loc[0] != 0 || size_t(in.query_start_loc[ns]) != n)
    throw Error("step inputs: query_start_loc must have num_seqs + 1 entries from 0 to num_tokens");
  if (in.block_tables.size() != ns * size_t(in.max_blocks_per_seq))
    throw Error("step inputs: block_tables must be num_seqs x max_blocks_per_seq");
  const int64_t num_blocks = m_.cache_options().num_blocks;
  const int bs = m_.block_size();
  const int64_t slots = num_blocks * bs;
  Bounds b;
  for (size_t i = 0; i < n; ++i) {
    if (in.token_ids[i] < 0 || in.token_ids[i] >= cfg.vocab_size)
      throw Error("token id " + std::to_string(in.token_ids[i]) + " is outside the vocabulary [0, " +
                  std::to_string(cfg.vocab_size) + ")");
    if (in.slot_mapping[i] >= slots) throw Error("step inputs: slot outside the cache");
    b.max_position = std::max(b.max_position, in.positions[i]);
  }
  for (size_t s = 0; s < ns; ++s) {
    const int32_t q = in.query_start_loc[s + 1] - in.query_start_loc[s];
    if (q < 0 || in.seq_lens[s] < q)
      throw Error("step inputs: sequence " + std::to_string(s) + " has fewer keys than new tokens");
    const int64_t blocks = (in.seq_lens[s] + bs - 1) / bs;
    if (blocks > in.max_blocks_per_seq)
      throw Error("step inputs: sequence " + std::to_string(s) + " needs more blocks than its table has");
    for (int64_t k = 0; k < blocks; ++k) {
      const int32_t phys = in.block_tables[s * in.max_blocks_per_seq + k];
      if (phys < 0 || phys >= num_blocks) throw Error("step inputs: block table entry outside the cache");
    }
    b.max_seq = std::max(b.max_seq, in.seq_lens[s]);
    b.max_query = std::max(b.max_query, q);
  }
  for (int32_t r : in.logits_indices)
    if (r < 0 || size_t(r) >= n) throw Error("step inputs: logits index outside the batch");
  return b;
}

float* Runner::logits_rows(int64_t rows) {
  if (grow(logits_, dev_, size_t(rows * m_.vocab_size()) * sizeof(float))) ++logits_epoch_;
  return logits_.as<float>();
}

model::StepView Runner::upload(const StepInputs& in, const Bounds& b, Buffer& dst, bool pinned) {
  // The six arrays at 16-byte aligned offsets of one buffer.
  size_t staged = 0;
  auto place = [&](size_t bytes) {
    const size_t at = staged;
    staged += (bytes + 15) / 16 * 16;
    return at;
  };
  const size_t o_ids = place(in.token_ids.size() * 4), o_pos = place(in.positions.size() * 4);
  const size_t o_slots = place(in.slot_mapping.size() * 8), o_qsl = place(in.query_start_loc.size() * 4);
  const size_t o_lens = place(in.seq_lens.size() * 4), o_bt = place(in.block_tables.size() * 4);
  const size_t o_hr = place(in.hidden_rows.size() * 4), o_dr = place(in.draft_rows.size() * 4);
  stage_.resize(staged);
  auto put = [&](size_t at, const auto& v) {
    if (!v.empty()) std::memcpy(stage_.data() + at, v.data(), v.size() * sizeof(v[0]));
  };
  put(o_ids, in.token_ids);
  put(o_pos, in.positions);
  put(o_slots, in.slot_mapping);
  put(o_qsl, in.query_start_loc);
  put(o_lens, in.seq_lens);
  put(o_bt, in.block_tables);
  put(o_hr, in.hidden_rows);
  put(o_dr, in.draft_rows);
  if (pinned && dst.bytes() < staged) throw Error("graph inputs changed size");
  grow(dst, dev_, staged);
  copy_to_device(dev_, dst.data(), stage_.data(), staged);
  const uint8_t* d = static_cast<const uint8_t*>(dst.data());

  model::StepView v;
  v.batch.num_seqs = int(in.seq_lens.size());
  v.batch.num_tokens = int64_t(in.token_ids.size());
  v.batch.query_start_loc = reinterpret_cast<const int32_t*>(d + o_qsl);
  v.batch.seq_lens = reinterpret_cast<const int32_t*>(d + o_lens);
  v.batch.block_tables = reinterpret_cast<const int32_t*>(d + o_bt);
  v.batch.max_blocks_per_seq = in.max_blocks_per_seq;
  v.batch.max_seq_len = b.max_seq;
  v.batch.max_query_len = b.max_query;
  v.token_ids = reinterpret_cast<const int32_t*>(d + o_ids);
  v.positions = reinterpret_cast<const int32_t*>(d + o_pos);
  v.slot_mapping = reinterpret_cast<const int64_t*>(d + o_slots);
  v.max_position = b.max_position;
  v.logits_rows = in.logits_indices;
  v.logits = logits_rows(int64_t(in.logits_indices.size()));
  hidden_rows_dev_ = in.hidden_rows.empty() ? nullptr : reinterpret_cast<const int32_t*>(d + o_hr);
  draft_rows_dev_ = in.draft_rows.empty() ? nullptr : reinterpret_cast<const int32_t*>(d + o_dr);
  if (draft_) {
    const auto& layers = draft_->config().aux_layers;
    const size_t bytes = layers.size() * in.token_ids.size() * size_t(m_.config().hidden_size) * sizeof(float);
    if (grow(aux_, dev_, bytes)) ++logits_epoch_;  // captured steps point at it
    v.aux_layers = layers;
    v.aux_hidden = aux_.as<float>();
  }
  return v;
}

void Runner::check_draft_allowed() const {
  if (followers_)
    throw Error("--speculative-config: the eagle3 draft does not run with --tensor-parallel-size > 1 yet (ngram does)");
}

void Runner::set_draft(spec::Eagle3Draft* d) {
  if (d) check_draft_allowed();
  draft_ = d;
  graphs_.clear();
}

void Runner::draft_argmax(int64_t rows, std::vector<int32_t>& out) {
  const int64_t dv = draft_->config().draft_vocab_size;
  const auto& d2t = draft_->draft_to_target();
  out.resize(size_t(rows));
  if (rows == 0) return;
  if (!opts_.device_sampling) {
    draft_host_.resize(size_t(rows * dv));
    copy_to_host(dev_, draft_host_.data(), draft_logits_.data(), draft_host_.size() * sizeof(float));
    for (int64_t r = 0; r < rows; ++r)
      out[size_t(r)] = d2t[size_t(cpu::first_argmax(draft_host_.data() + r * dv, dv))];
    return;
  }
  // The op on the device (greedy, through the map); only the ids come back.
  if (d2t_of_ != draft_) {
    grow(d2t_, dev_, d2t.size() * sizeof(int32_t));
    copy_to_device(dev_, d2t_.data(), d2t.data(), d2t.size() * sizeof(int32_t));
    d2t_of_ = draft_;
  }
  if (rows > greedy_rows_) {
    if (grow(sample_rows_, dev_, size_t(rows) * sizeof(ops::SampleRow))) greedy_rows_ = 0;
    sample_stage_.assign(size_t(rows), ops::SampleRow{1.0, 0.0, int32_t(ops::SampleMode::Greedy), 0});
    copy_to_device(dev_, sample_rows_.data(), sample_stage_.data(), size_t(rows) * sizeof(ops::SampleRow));
    greedy_rows_ = rows;
  }
  grow(sample_ids_, dev_, size_t(rows) * sizeof(int32_t));
  ops::SampleParams p;
  p.logits = draft_logits_.as<float>();
  p.rows = rows;
  p.vocab = dv;
  p.row = sample_rows_.as<ops::SampleRow>();
  p.id_map = d2t_.as<int32_t>();
  p.out = sample_ids_.as<int32_t>();
  p.any_filtered = false;  // greedy rows
  ops::sample(p, stream_);
  copy_to_host(dev_, out.data(), sample_ids_.data(), size_t(rows) * sizeof(int32_t));
}

int64_t Runner::draft_pass(const StepInputs& in, const Bounds& b, int kind, int64_t extra, bool padded,
                           const float* aux, int64_t prev_rows) {
  const int64_t dv = draft_->config().draft_vocab_size;
  // Kind 3: a first pass that proposes nothing (speculation paused) keeps the draft's cache
  // current without its lm_head.
  const bool logits = kind != 3;
  auto fwd = [this, aux, prev_rows, logits](const model::StepView& v) {
    spec::DraftStep ds;
    ds.batch = v.batch;
    ds.token_ids = v.token_ids;
    ds.positions = v.positions;
    ds.slot_mapping = v.slot_mapping;
    ds.max_position = v.max_position;
    ds.aux = aux;
    ds.hidden_rows = hidden_rows_dev_;
    ds.prev_rows = prev_rows;
    ds.logits_rows = draft_rows_dev_;
    ds.num_logits = logits ? v.batch.num_seqs : 0;
    ds.logits = draft_logits_.as<float>();
    draft_->forward(ds, stream_);
  };
  const int q = uniform_draft_q(in);
  if (padded && q > 0) {
    const auto key = std::make_tuple(kind, int(in.seq_lens.size()), q, b.max_seq, extra);
    if (run_graph(key, in, b, fwd)) return int64_t(in.seq_lens.size());
  }
  (void)dv;
  const model::StepView v = upload(in, b, inputs_, false);
  phase(Phase::DraftUploaded);
  fwd(v);
  phase(Phase::DraftComputed);
  return int64_t(in.seq_lens.size());
}

void Runner::propose(const DraftPlan& plan, std::vector<std::vector<int32_t>>& drafts) {
  SIEVE_CHECK(draft_, "propose() without a draft");
  use_device(dev_);
  const size_t n_real = plan.next_tokens.size();
  SIEVE_CHECK(n_real <= last_.token_ids.size() && plan.slots.size() == n_real, "draft plan does not match the step");
  const int64_t dv = draft_->config().draft_vocab_size;
  const int64_t nprop = int64_t(plan.seqs.size());
  // The first pass: the last step's layout (padded as it ran, so the aux rows line up), one draft
  // row per sequence (its last kept row when it proposes).
  StepInputs c = last_;
  std::copy(plan.next_tokens.begin(), plan.next_tokens.end(), c.token_ids.begin());
  std::copy(plan.slots.begin(), plan.slots.end(), c.slot_mapping.begin());
  c.logits_indices.clear();
  c.hidden_rows.clear();
  c.draft_rows.assign(c.query_start_loc.begin(), c.query_start_loc.end() - 1);
  for (const auto& q : plan.seqs) c.draft_rows[size_t(q.step_seq)] = q.last_row;
  if (grow(draft_logits_, dev_, size_t(std::max<size_t>(c.seq_lens.size(), size_t(graph_rows(int(nprop))))) * size_t(dv) * sizeof(float)))
    ++logits_epoch_;
  draft_pass(c, last_bounds_, nprop > 0 ? 1 : 3, int64_t(c.token_ids.size()), last_padded_, aux_.as<float>(), 0);
  drafts.assign(size_t(nprop), {});
  if (nprop == 0) return;
  std::vector<int32_t> next, all;
  draft_argmax(int64_t(c.seq_lens.size()), all);
  next.resize(size_t(nprop));
  for (int64_t i = 0; i < nprop; ++i) next[size_t(i)] = all[size_t(plan.seqs[size_t(i)].step_seq)];
  for (int64_t i = 0; i < nprop; ++i) drafts[size_t(i)].push_back(next[size_t(i)]);
  int64_t prev_rows = int64_t(c.token_ids.size());
  const int bs = m_.block_size();
  for (int j = 1; j < plan.num_tokens; ++j) {
    StepInputs d;
    int width = 1;
    for (const auto& q : plan.seqs) width = std::max(width, int(q.block_table.size()));
    d.max_blocks_per_seq = width;
    d.block_tables.assign(size_t(nprop) * size_t(width), 0);
    d.query_start_loc.push_back(0);
    for (int64_t i = 0; i < nprop; ++i) {
      const auto& q = plan.seqs[size_t(i)];
      const int64_t pos = q.first_pos + j - 1;
      SIEVE_CHECK(int64_t(q.block_table.size()) * bs > pos, "draft position past the block table");
      d.token_ids.push_back(next[size_t(i)]);
      d.positions.push_back(int32_t(pos));
      d.slot_mapping.push_back(int64_t(q.block_table[size_t(pos / bs)]) * bs + pos % bs);
      d.query_start_loc.push_back(int32_t(i + 1));
      d.seq_lens.push_back(int32_t(pos + 1));
      std::copy(q.block_table.begin(), q.block_table.end(), d.block_tables.begin() + long(size_t(i) * size_t(width)));
      d.hidden_rows.push_back(j == 1 ? q.last_row : int32_t(i));
      d.draft_rows.push_back(int32_t(i));
    }
    const Bounds b = check(d);
    int64_t rows = nprop;
    const auto [grows, keys] = graph_shape(int(nprop), b.max_seq);
    if (grows > 0) {
      const StepInputs p = pad_uniform_step(d, 1, grows, int(keys / bs), int32_t(m_.cache_options().num_blocks), bs);
      Bounds pb = b;
      pb.max_seq = int(keys);
      pb.max_query = 1;
      rows = draft_pass(p, pb, 2, prev_rows, true, nullptr, prev_rows);
    } else {
      rows = draft_pass(d, b, 2, prev_rows, false, nullptr, prev_rows);
    }
    draft_argmax(nprop, next);
    for (int64_t i = 0; i < nprop; ++i) drafts[size_t(i)].push_back(next[size_t(i)]);
    prev_rows = rows;
  }
}

HostLogits::~HostLogits() { free_host(memory_, p_); }

float* HostLogits::resize(const Device& device, size_t n) {
  if (n > cap_ || !(device == device_)) {
    // Page-locked memory is a scarce resource of the host: a step that wants every row's logits
    // of a long prompt (prompt log-probs) gets ordinary memory past 1 GiB. Below that the room
    // doubles, so that a batch growing a sequence at a time page-locks a few times, not each step.
    constexpr size_t kPinnedFloats = (size_t(1) << 30) / sizeof(float);
    const size_t cap = device == device_ ? std::max(n, std::min(2 * cap_, kPinnedFloats)) : n;
    free_host(memory_, p_);
    p_ = nullptr;  // (alloc_host may throw)
    cap_ = n_ = 0;
    device_ = device;
    memory_ = cap > kPinnedFloats ? Device{} : device;
    p_ = static_cast<float*>(alloc_host(memory_, cap * sizeof(float)));
    cap_ = cap;
  }
  n_ = n;
  return p_;
}

void Runner::copy_rows(int64_t r0, int64_t r1, int64_t layout_rows, float* dst) {
  const int64_t V = m_.vocab_size();
  const int shards = m_.logits_shards();
  if (r1 <= r0) return;
  if (shards == 1) {
    copy_to_host(dev_, dst, logits_.as<float>() + r0 * V, size_t((r1 - r0) * V) * sizeof(float));
    return;
  }
  // [shards, layout_rows, V / shards] -> [rows, V]
  const int64_t vs = V / shards, n = r1 - r0;
  shards_.resize(size_t(n * vs));
  for (int i = 0; i < shards; ++i) {
    copy_to_host(dev_, shards_.data(), logits_.as<float>() + (i * layout_rows + r0) * vs, shards_.size() * sizeof(float));
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(dst + r * V + i * vs, shards_.data() + r * vs, size_t(vs) * sizeof(float));
  }
}

void Runner::read_logits(int64_t rows, int64_t layout_rows, const LogitsSink& out) {
  // Every element is overwritten (the sink's memory is reused from step to step).
  float* logits = out(size_t(rows * m_.vocab_size()));
  copy_rows(0, rows, layout_rows, logits);
}

void Runner::sample_rows(int64_t rows, int64_t layout_rows, const std::vector<ops::SampleRow>& req,
                         StepOutput& out) {
  const int64_t V = m_.vocab_size();
  out.vocab = V;
  out.tokens.assign(size_t(rows), -1);
  out.host_row.assign(size_t(rows), -1);
  if (any_on_device(req)) {
    // The op runs over the whole layout (a padded graph step's rows too; they are skipped).
    ops::SampleParams p;
    p.logits = logits_.as<float>();
    p.rows = layout_rows;
    p.vocab = V;
    p.shards = m_.logits_shards();
    p.row = sample_rows_.as<ops::SampleRow>();
    p.out = sample_ids_.as<int32_t>();
    p.any_filtered = std::any_of(req.begin(), req.end(),
                                 [](const ops::SampleRow& r) { return r.mode == int32_t(ops::SampleMode::Filtered); });
    ops::sample(p, stream_);
    phase(Phase::Sampled);
    copy_to_host(dev_, out.tokens.data(), sample_ids_.data(), size_t(rows) * sizeof(int32_t));
  }
  // The rows the host needs, compacted, a copy per run of consecutive rows.
  int64_t n_host = 0;
  for (int64_t i = 0; i < rows; ++i)
    if (out.tokens[size_t(i)] < 0) out.host_row[size_t(i)] = int32_t(n_host++);
  if (n_host == 0) return;  // (no room to make: page-locking nothing may fail)
  float* dst = out.logits.resize(dev_, size_t(n_host * V));
  for (int64_t i = 0; i < rows;) {
    if (out.host_row[size_t(i)] < 0) {
      ++i;
      continue;
    }
    int64_t j = i + 1;
    while (j < rows && out.host_row[size_t(j)] >= 0) ++j;
    copy_rows(i, j, layout_rows, dst + int64_t(out.host_row[size_t(i)]) * V);
    i = j;
  }
}

void Runner::lockstep(const RankCommand& c, const std::function<void()>& local) {
  if (!followers_) return local();
  if (const std::string why = followers_->broken(); !why.empty())
    throw Error("the tensor-parallel group stopped earlier: " + why);
  followers_->start(c);
  try {
    local();
  } catch (const std::exception& e) {
    followers_->finish(e.what());  // throws the first rank's failure
    throw;
  }
  followers_->finish("");
}

void Runner::apply(const RankCommand& c) {
  switch (c.kind) {
    case RankCommand::Kind::Run: {
      std::vector<float> unused;  // the leader's logits are the ones read
      run(c.in, unused);
      return;
    }
    case RankCommand::Kind::AllocateCaches: return allocate_caches(c.caches);
    case RankCommand::Kind::ReleaseCaches: return release_caches();
    case RankCommand::Kind::Reserve: return reserve(c.max_tokens, c.max_seqs);
  }
}

void Runner::allocate_caches(const model::CacheOptions& co) {
  RankCommand c;
  c.kind = RankCommand::Kind::AllocateCaches;
  c.caches = co;
  lockstep(c, [&] { m_.allocate_caches(co); });
}

void Runner::release_caches() {
  RankCommand c;
  c.kind = RankCommand::Kind::ReleaseCaches;
  lockstep(c, [&] { m_.release_caches(); });
}

void Runner::run(const StepInputs& in, std::vector<float>& logits) {
  const LogitsSink sink = [&](size_t n) {
    logits.resize(n);
    return logits.data();
  };
  run_sink(in, [&](int64_t rows, int64_t layout_rows) { read_logits(rows, layout_rows, sink); });
}

void Runner::run(const StepInputs& in, HostLogits& logits) {
  const LogitsSink sink = [&](size_t n) { return logits.resize(dev_, n); };
  run_sink(in, [&](int64_t rows, int64_t layout_rows) { read_logits(rows, layout_rows, sink); });
}

void Runner::run(const StepInputs& in, const std::vector<ops::SampleRow>& rows, StepOutput& out) {
  SIEVE_CHECK(rows.size() == in.logits_indices.size(), "one sampling request per logits row expected");
  if (!opts_.device_sampling || !any_on_device(rows)) {
    const std::vector<ops::SampleRow> all_host(rows.size());
    return run_sink(in, [&](int64_t n, int64_t layout_rows) { sample_rows(n, layout_rows, all_host, out); });
  }
  // The rows' parameters go up before the forward is enqueued; a graph step's padding rows (Skip)
  // are added after it, when it has them.
  use_device(dev_);
  auto stage = [&](size_t n) {
    sample_stage_.assign(n, ops::SampleRow{});
    std::copy(rows.begin(), rows.end(), sample_stage_.begin());
    greedy_rows_ = 0;
    grow(sample_rows_, dev_, n * sizeof(ops::SampleRow));
    grow(sample_ids_, dev_, n * sizeof(int32_t));
    copy_to_device(dev_, sample_rows_.data(), sample_stage_.data(), n * sizeof(ops::SampleRow));
  };
  stage(rows.size());
  run_sink(in, [&](int64_t n, int64_t layout_rows) {
    if (size_t(layout_rows) > rows.size()) stage(size_t(layout_rows));
    sample_rows(n, layout_rows, rows, out);
  });
}

void Runner::run_sink(const StepInputs& in, const LogitsReader& read) {
  // Bad inputs are refused before any rank starts (a failed rank would break the group).
  if (followers_) check(in);
  if (!followers_) return run_here(in, read);
  // The followers run the same inputs; their logits are not read.
  RankCommand c;
  c.in = in;
  lockstep(c, [&] { run_here(in, read); });
}

void Runner::run_here(const StepInputs& in, const LogitsReader& read) {
  use_device(dev_);  // the engine's thread is not the one that made the model
  const Bounds b = check(in);
  phase(Phase::Begin);
  if (graph_step(in, b, read)) return;
  if (draft_) {
    last_ = in;
    last_bounds_ = b;
    last_padded_ = false;
  }
  const model::StepView v = upload(in, b, inputs_, false);
  phase(Phase::Uploaded);
  m_.forward(v, stream_);
  phase(Phase::Computed);
  read(int64_t(in.logits_indices.size()), int64_t(in.logits_indices.size()));
  phase(Phase::Done);
}

std::pair<int, int64_t> Runner::graph_shape(int n, int max_seq) const {
  if (!dev_.is_cuda() || opts_.enforce_eager || !graph_stats_.off_reason.empty() || m_.cache_options().compare_index ||
      n > opts_.max_graph_batch)
    return {0, 0};
  // Context bucket: the grids are those of `keys` keys, and the kernels take any live length up
  // to it. Buckets 8 blocks x 2^k and 12 blocks x 2^k, so a grid is sized for at most 4/3 of the
  // blocks its longest sequence has (past 8 blocks).
  const int bs = m_.block_size();
  int64_t blocks = 8;
  while (blocks * bs < max_seq) blocks = blocks % 3 == 0 ? blocks / 3 * 4 : blocks / 2 * 3;
  const int64_t keys = blocks * bs;
  if (keys > (int64_t(1) << 30)) return {0, 0};
  return {graph_rows(n), keys};
}

bool Runner::run_graph(const std::tuple<int, int, int, int, int64_t>& key, const StepInputs& p, const Bounds& pb,
                       const std::function<void(const model::StepView&)>& fwd) {
  const uint64_t draft_epoch = draft_ ? draft_->buffers_epoch() : 0;
  const bool target = std::get<0>(key) == 0;  // the target's step, else one of the draft's passes
  const Phase uploaded = target ? Phase::Uploaded : Phase::DraftUploaded;
  const Phase computed = target ? Phase::Computed : Phase::DraftComputed;
  // Graphs captured before a buffer they point at was replaced are retired.
  std::erase_if(graphs_, [&](const auto& kv) {
    return kv.second.model_epoch != m_.buffers_epoch() || kv.second.logits_epoch != logits_epoch_ ||
           kv.second.draft_epoch != draft_epoch;
  });
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    it->second.used = ++graph_clock_;
    upload(p, pb, it->second.inputs, true);
    phase(uploaded);
    it->second.graph.replay(stream_.cuda_stream);
    phase(computed);
    ++graph_stats_.replayed;
    return true;
  }
  // First use of the shape: run it eagerly on the graph's own inputs (this step's result; the
  // buffers and the kernels' workspaces grow to the shape), then capture the same work.
  StepGraph g;
  const model::StepView v = upload(p, pb, g.inputs, false);
  phase(uploaded);
  fwd(v);
  phase(computed);
  ++graph_stats_.eager;
  std::string why;
  // (The eager run may have grown a buffer: the view is taken again for the capture.)
  const model::StepView v2 = upload(p, pb, g.inputs, true);
  g.graph = Graph::capture(dev_, stream_.cuda_stream, [&] { fwd(v2); }, &why);
  if (!g.graph) {
    graph_stats_.off_reason = why.empty() ? "capture failed" : why;
    graphs_.clear();
    SIEVE_LOG(Warn, "CUDA graphs turned off, steps run eagerly: " << graph_stats_.off_reason);
    return true;
  }
  g.model_epoch = m_.buffers_epoch();
  g.logits_epoch = logits_epoch_;
  g.draft_epoch = draft_ ? draft_->buffers_epoch() : 0;
  g.used = ++graph_clock_;
  ++graph_stats_.captured;
  // At most kMaxGraphs kept (each holds its kernels' launch records): the least recently
  // replayed goes.
  if (graphs_.size() >= kMaxGraphs)
    graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
      return a.second.used < b.second.used;
    }));
  SIEVE_LOG(Debug, "captured a step of kind " << std::get<0>(key) << ": " << std::get<1>(key) << " sequences of "
                                              << std::get<2>(key) << " tokens, contexts up to " << std::get<3>(key)
                                              << " keys");
  graphs_.emplace(key, std::move(g));
  return true;
}

bool Runner::graph_step(const StepInputs& in, const Bounds& b, const LogitsReader& read) {
  const int q = dev_.is_cuda() ? uniform_q(in) : 0;
  // Graphs take decode and verification steps (1 to K+1 tokens per sequence); a prefill that
  // wants every row's logits is uniform too, but runs eagerly.
  if (q == 0 || q > spec::kMaxSpeculativeTokens + 1 || q > m_.block_size()) return false;
  const int ns = int(in.seq_lens.size());
  const auto [rows, keys] = graph_shape(ns, b.max_seq);
  if (rows == 0) {
    ++graph_stats_.eager;
    return false;
  }
  const int bs = m_.block_size();
  const StepInputs p = pad_uniform_step(in, q, rows, int(keys / bs), int32_t(m_.cache_options().num_blocks), bs);
  // Padding rows hold q tokens at positions 0..q-1, so the real rows' position bound holds.
  Bounds pb = b;
  pb.max_seq = int(keys);
  pb.max_query = q;
  if (draft_) {
    last_ = p;
    last_bounds_ = pb;
    last_padded_ = true;
  }
  run_graph(std::make_tuple(0, rows, q, int(keys), int64_t(0)), p, pb, [this](const model::StepView& v) { m_.forward(v, stream_); });
  read(int64_t(in.token_ids.size()), int64_t(p.token_ids.size()));
  phase(Phase::Done);
  return true;
}

void warm_up(Runner& r, DType kv_dtype, DType index_dtype, int64_t tokens) {
  model::Model& m = r.model();
  const int64_t n = std::max<int64_t>(1, tokens);
  const int bs = m.block_size();
  const int64_t blocks = (n + bs - 1) / bs;
  model::CacheOptions co;
  co.kv_dtype = kv_dtype;
  co.index_dtype = index_dtype;
  co.num_blocks = blocks;
  r.allocate_caches(co);
  StepInputs in;
  const int64_t V = m.vocab_size();
  for (int64_t i = 0; i < n; ++i) {
    in.token_ids.push_back(int32_t((i * 7919) % V));
    in.positions.push_back(int32_t(i));
    in.slot_mapping.push_back(i);  // block b at physical block b
  }
  for (int64_t b = 0; b < blocks; ++b) in.block_tables.push_back(int32_t(b));
  in.query_start_loc = {0, int32_t(n)};
  in.seq_lens = {int32_t(n)};
  in.max_blocks_per_seq = int(blocks);
  in.logits_indices = {int32_t(n - 1)};
  std::vector<float> logits;
  r.run(in, logits);
  r.release_caches();
}

}  // namespace sieve::engine
