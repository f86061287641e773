// The model-loading flags that generate, eval perplexity, serve and bench step share (vLLM's
// names), and the progress line printed while weights load.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "cli/command.h"
#include "engine/rank_group.h"
#include "model/model.h"

namespace sieve::cli {

// --device, --hf-overrides, --quantization, --load-format.
void add_model_load_flags(Args& a);

// LoadOptions from those flags (--device auto falls back to the CPU for a model the CUDA
// kernels cannot run), with a progress printer on stderr.
model::LoadOptions model_load_options(const Args& a);

// --tensor-parallel-size / -tp, --enable-expert-parallel, --nnodes, --node-rank,
// --dist-init-addr, --dist-timeout.
void add_parallel_flags(Args& a);

// The model of `dir` as the load and parallel flags say: one rank, or -tp ranks in lockstep
// (engine/rank_group.h; CPU threads, or one GPU per rank over NCCL). The runner to drive is
// group->leader(), its model group->model().
// `lo`: model_load_options(a), as the command adjusts them (the parallel fields are set here).
std::unique_ptr<engine::RankGroup> load_model_group(const std::string& dir, const Args& a, model::LoadOptions lo,
                                                    const engine::RunnerOptions& ro = {});
std::unique_ptr<engine::RankGroup> load_model_group(const std::string& dir, const Args& a,
                                                    const engine::RunnerOptions& ro = {});

// The process of another node than node 0 (--node-rank > 0): runs node 0's steps on its ranks
// until node 0 ends the run, and returns true (the command then exits); false on node 0.
bool follow_node_zero(engine::RankGroup& g);

// A progress callback (done, total bytes) for core/progress.h's bar (bytes, rate, time left; on
// a terminal in place, else a log line every few seconds); silent for loads under a second.
std::function<void(uint64_t, uint64_t)> load_progress_printer(const std::string& what);

}  // namespace sieve::cli
