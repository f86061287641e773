#include "engine/runner.h"

#include <algorithm>
#include <cstring>

#include "core/error.h"
#include "core/log.h"

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
    const int64_t rows = s.all_logits ? n : (s.sample ? 1 : 0);
    for (int64_t i = n - rows; i < n; ++i) {
      in.logits_indices.push_back(int32_t(in.token_ids.size() - size_t(n) + size_t(i)));
      if (row_seq) row_seq->push_back(int(si));
    }
  }
  return in;
}

StepInputs pad_decode_step(const StepInputs& in, int rows, int width, int32_t pad_block, int block_size) {
  const size_t n = in.token_ids.size();
  SIEVE_CHECK(in.seq_lens.size() == n && in.logits_indices.size() == n, "pad_decode_step: not a decode step");
  SIEVE_CHECK(size_t(rows) >= n, "pad_decode_step: fewer rows than sequences");
  StepInputs p;
  p.token_ids = in.token_ids;
  p.token_ids.resize(size_t(rows), 0);
  p.positions = in.positions;
  p.positions.resize(size_t(rows), 0);
  p.slot_mapping = in.slot_mapping;
  p.slot_mapping.resize(size_t(rows), int64_t(pad_block) * block_size);
  p.seq_lens = in.seq_lens;
  p.seq_lens.resize(size_t(rows), 1);
  p.max_blocks_per_seq = width;
  p.block_tables.assign(size_t(rows) * size_t(width), pad_block);
  for (size_t s = 0; s < n; ++s) {
    const int blocks = (in.seq_lens[s] + block_size - 1) / block_size;
    SIEVE_CHECK(blocks <= width && blocks <= in.max_blocks_per_seq, "pad_decode_step: table too narrow");
    std::copy_n(in.block_tables.begin() + long(s * size_t(in.max_blocks_per_seq)), blocks,
                p.block_tables.begin() + long(s * size_t(width)));
  }
  for (int i = 0; i <= rows; ++i) p.query_start_loc.push_back(i);
  for (int i = 0; i < rows; ++i) p.logits_indices.push_back(i);
  return p;
}

// ---------------------------------------------------------------------------------------------
// Runner

namespace {

constexpr size_t kMaxGraphs = 64;

// Padded batch sizes: 1, 2, 4, 8, then multiples of 8 (vLLM's capture sizes).
int graph_rows(int n) { return n <= 4 ? (n <= 1 ? 1 : n <= 2 ? 2 : 4) : (n + 7) / 8 * 8; }

// A decode step: one new token per sequence and its logit row, in order.
bool is_decode_step(const StepInputs& in) {
  const size_t n = in.token_ids.size();
  if (n == 0 || n != in.seq_lens.size() || in.logits_indices.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (in.logits_indices[i] != int32_t(i) || in.query_start_loc[i + 1] != int32_t(i + 1)) return false;
  return true;
}

// b holding at least `bytes` (at least 1), replaced (contents lost) when smaller; true if it was.
bool grow(Buffer& b, const Device& dev, size_t bytes) {
  bytes = std::max<size_t>(bytes, 1);
  if (b.bytes() >= bytes) return false;
  b = Buffer(dev, bytes + bytes / 4);
  return true;
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
  const int64_t rows = std::min(max_tokens, max_seqs);
  use_device(dev_);
  m_.reserve_step(max_tokens, rows);
  logits_rows(rows);
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
  return v;
}

void Runner::read_logits(int64_t rows, std::vector<float>& logits) const {
  logits.assign(size_t(rows * m_.vocab_size()), 0.0f);
  if (rows > 0) copy_to_host(dev_, logits.data(), logits_.data(), logits.size() * sizeof(float));
}

void Runner::run(const StepInputs& in, std::vector<float>& logits) {
  use_device(dev_);  // the engine's thread is not the one that made the model
  const Bounds b = check(in);
  phase(Phase::Begin);
  if (graph_step(in, b, logits)) return;
  const model::StepView v = upload(in, b, inputs_, false);
  phase(Phase::Uploaded);
  m_.forward(v, stream_);
  phase(Phase::Computed);
  read_logits(int64_t(in.logits_indices.size()), logits);
  phase(Phase::Done);
}

bool Runner::graph_step(const StepInputs& in, const Bounds& b, std::vector<float>& logits) {
  if (!dev_.is_cuda() || !is_decode_step(in)) return false;
  const int n = int(in.token_ids.size());
  if (opts_.enforce_eager || !graph_stats_.off_reason.empty() || m_.cache_options().compare_index ||
      n > opts_.max_graph_batch) {
    ++graph_stats_.eager;
    return false;
  }
  const int rows = graph_rows(n);
  // Context bucket: the grids are those of `keys` keys, and the kernels take any live length up
  // to it. Buckets 8 blocks x 2^k and 12 blocks x 2^k, so a grid is sized for at most 4/3 of the
  // blocks its longest sequence has (past 8 blocks).
  const int bs = m_.block_size();
  int64_t blocks = 8;
  while (blocks * bs < b.max_seq) blocks = blocks % 3 == 0 ? blocks / 3 * 4 : blocks / 2 * 3;
  const int64_t keys = blocks * bs;
  if (keys > (int64_t(1) << 30)) {
    ++graph_stats_.eager;
    return false;
  }
  const StepInputs p = pad_decode_step(in, rows, int(blocks), int32_t(m_.cache_options().num_blocks), bs);
  // Padding rows hold one token at position 0, so the real rows' position bound holds.
  Bounds pb = b;
  pb.max_seq = int(keys);
  pb.max_query = 1;
  const auto key = std::make_pair(rows, int(keys));
  // Graphs captured before a buffer they point at was replaced are retired.
  std::erase_if(graphs_, [&](const auto& kv) {
    return kv.second.model_epoch != m_.buffers_epoch() || kv.second.logits_epoch != logits_epoch_;
  });
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    it->second.used = ++graph_clock_;
    upload(p, pb, it->second.inputs, true);
    phase(Phase::Uploaded);
    it->second.graph.replay(stream_.cuda_stream);
    phase(Phase::Computed);
    ++graph_stats_.replayed;
    read_logits(n, logits);
    phase(Phase::Done);
    return true;
  }
  // First use of the shape: run it eagerly on the graph's own inputs (this step's result; the
  // buffers and the kernels' workspaces grow to the shape), then capture the same work.
  StepGraph g;
  const model::StepView v = upload(p, pb, g.inputs, false);
  phase(Phase::Uploaded);
  m_.forward(v, stream_);
  phase(Phase::Computed);
  read_logits(n, logits);
  phase(Phase::Done);
  ++graph_stats_.eager;
  std::string why;
  g.graph = Graph::capture(dev_, stream_.cuda_stream, [&] { m_.forward(v, stream_); }, &why);
  if (!g.graph) {
    graph_stats_.off_reason = why.empty() ? "capture failed" : why;
    graphs_.clear();
    SIEVE_LOG(Warn, "CUDA graphs turned off, decode steps run eagerly: " << graph_stats_.off_reason);
    return true;
  }
  g.model_epoch = m_.buffers_epoch();
  g.logits_epoch = logits_epoch_;
  g.used = ++graph_clock_;
  ++graph_stats_.captured;
  // At most kMaxGraphs kept (each holds its kernels' launch records): the least recently
  // replayed goes.
  if (graphs_.size() >= kMaxGraphs)
    graphs_.erase(std::min_element(graphs_.begin(), graphs_.end(), [](const auto& a, const auto& b) {
      return a.second.used < b.second.used;
    }));
  SIEVE_LOG(Debug, "captured the decode step of " << rows << " sequences, contexts up to " << keys << " keys");
  graphs_.emplace(key, std::move(g));
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
  m.allocate_caches(co);
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
  m.release_caches();
}

}  // namespace sieve::engine
