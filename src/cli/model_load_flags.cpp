#include "cli/model_load_flags.h"

#include <chrono>
#include <memory>

#include "core/error.h"
#include "core/log.h"
#include "core/progress.h"
#include "io/config.h"
#include "model/rank_layout.h"
#include "parallel/nccl_group.h"
#include "parallel/rendezvous.h"

namespace sieve::cli {

void add_model_load_flags(Args& a) {
  a.opt({"--device"}, "DEVICE", "auto (a GPU when there is one and it can run the model), cpu, cuda or cuda:N", "auto")
      .opt({"--hf-overrides"}, "JSON", "JSON object merged over the model config")
      .opt({"--quantization", "-q"}, "METHOD",
           "fp8: quantize a BF16 checkpoint's projections to FP8 at load (128x128 blocks); default: as stored")
      .opt({"--fp8-scale-blocks"}, "BLOCKS",
           "MXFP8 checkpoints: auto (1x32 scales regrouped to 1x128 on CUDA, as stored on the CPU) or 128x128 "
           "(one scale a 128x128 block on every device: the faster prefill kernels; values rescaled by powers of "
           "two, exact above fp8's subnormal range)",
           "auto")
      .opt({"--load-format"}, "FORMAT",
           "auto (the directory's safetensors) or dummy (random weights of the config's shapes and formats, "
           "made on the device; no weight file is read)",
           "auto")
      .flag({"--side-stream"}, "CUDA: the default; kept for scripts that name it (see --no-side-stream)")
      .flag({"--no-side-stream"},
            "CUDA: run each MoE layer's shared expert after its routing on the step's one stream (default: beside "
            "the routing on a second stream where the routing splits its router GEMM, decode batches)")
      .flag({"--f32-partials"},
            "CUDA: keep each sublayer's output and its tensor-parallel all-reduce in fp32 (default: bf16, half "
            "the bytes; the CPU is fp32 either way)");
}

model::LoadOptions model_load_options(const Args& a) {
  model::LoadOptions lo;
  lo.hf_overrides = a.get("--hf-overrides");
  lo.device = parse_device(a.get("--device"));
  lo.cpu_fallback = a.get("--device") == "auto";
  lo.quantization = a.get("--quantization");
  lo.fp8_scale_blocks = a.get("--fp8-scale-blocks");
  lo.load_format = a.get("--load-format");
  if (a.get_flag("--side-stream") && a.get_flag("--no-side-stream"))
    throw Error("--side-stream and --no-side-stream: give one");
  lo.side_stream = !a.get_flag("--no-side-stream");
  lo.f32_partials = a.get_flag("--f32-partials");
  lo.progress = load_progress_printer("loading weights");
  return lo;
}

void add_parallel_flags(Args& a) {
  a.opt({"--tensor-parallel-size", "-tp", "--tp-size", "--tensor_parallel_size"}, "N",
        "ranks the model is split over (one GPU each over NCCL; CPU: threads)", "1")
      .flag({"--enable-expert-parallel", "--enable_expert_parallel"},
            "deal the routed experts out whole over the ranks instead of splitting each")
      .opt({"--nnodes"}, "N", "machines the ranks are spread over", "1")
      .opt({"--node-rank"}, "R", "this machine's place among them (0 serves HTTP)", "0")
      .opt({"--dist-init-addr"}, "HOST:PORT", "where node 0 meets the others (node 0 listens there)")
      .opt({"--dist-timeout"}, "S", "seconds a rank waits for the others (joining, a collective)", "600");
}

std::unique_ptr<engine::RankGroup> load_model_group(const std::string& dir, const Args& a,
                                                    const engine::RunnerOptions& ro) {
  return load_model_group(dir, a, model_load_options(a), ro);
}

std::unique_ptr<engine::RankGroup> load_model_group(const std::string& dir, const Args& a, model::LoadOptions lo,
                                                    const engine::RunnerOptions& ro) {
  const long long tp = a.get_int("--tensor-parallel-size");
  if (tp < 1 || tp > 64) throw Error("--tensor-parallel-size must be in 1..64, got " + std::to_string(tp));
  const double timeout_s = a.get_double("--dist-timeout");
  if (!(timeout_s > 0)) throw Error("--dist-timeout must be a positive number of seconds");
  const auto timeout = std::chrono::milliseconds(int64_t(timeout_s * 1000));
  const long long nnodes = a.get_int("--nnodes"), node_rank = a.get_int("--node-rank");
  if (nnodes < 1) throw Error("--nnodes must be at least 1, got " + std::to_string(nnodes));
  lo.expert_parallel = a.get_flag("--enable-expert-parallel");
  if (lo.expert_parallel && tp == 1) SIEVE_LOG(Warn, "--enable-expert-parallel with one rank changes nothing");
  engine::RankGroupOptions go;
  go.size = int(tp);
  go.device = lo.device;
  go.timeout = timeout;
  go.runner = ro;
  const auto progress = lo.progress;
  auto load = [=](int rank, const Device& dev, ops::Collective* group) {
    model::LoadOptions l = lo;
    l.device = dev;
    l.tp_size = int(tp);
    l.tp_rank = rank;
    l.group = group;
    l.progress = rank == 0 ? progress : nullptr;  // one bar (the ranks load alike)
    if (tp > 1) l.cpu_fallback = false;            // decided below for every rank at once
    return model::Model::load(dir, l);
  };
  if (tp == 1 && nnodes == 1) return std::make_unique<engine::RankGroup>(std::move(go), load);

  // The split is checked before any rank starts, so that a bad -tp is named once, as a flag.
  const ModelConfig cfg = load_model_config(dir, lo.hf_overrides);
  try {
    model::RankLayout::make(cfg, int(tp), 0, lo.expert_parallel);
  } catch (const Error& e) {
    throw Error("--tensor-parallel-size " + std::to_string(tp) + ": " + dir + "/config.json: " + e.what());
  }
  if (nnodes > 1) {
    if (tp % nnodes != 0)
      throw Error("--tensor-parallel-size " + std::to_string(tp) + " does not split over --nnodes " +
                  std::to_string(nnodes));
    if (!a.has("--dist-init-addr")) throw Error("--nnodes " + std::to_string(nnodes) + " needs --dist-init-addr HOST:PORT");
    parallel::RendezvousOptions r;
    r.addr = a.get("--dist-init-addr");
    r.nnodes = int(nnodes);
    r.node_rank = int(node_rank);
    r.timeout = timeout;
    r.run_key = "tp=" + std::to_string(tp) + " nnodes=" + std::to_string(nnodes) +
                " ep=" + (lo.expert_parallel ? "1" : "0") + " model=" + cfg.model_type + "/" +
                std::to_string(cfg.num_hidden_layers) + "x" + std::to_string(cfg.hidden_size);
    // Node 0 makes the NCCL group's id; every node leaves with it, and with its connections.
    parallel::Joined joined =
        parallel::rendezvous_links(r, node_rank == 0 && parallel::have_nccl() ? parallel::nccl_unique_id() : "");
    const std::string& id = joined.payload;
    SIEVE_LOG(Info, "rendezvous: node " << node_rank << " of " << nnodes << " joined at " << r.addr << " ("
                                        << id.size() << " bytes of NCCL group id)");
    const long long local = tp / nnodes;
    if (!lo.device.is_cuda() || cuda_device_count() < local)
      throw Error("--nnodes " + std::to_string(nnodes) + ": node " + std::to_string(node_rank) + " needs " +
                  std::to_string(local) + " CUDA device(s) for its ranks, but this machine has " +
                  std::to_string(cuda_device_count()) + (lo.device.is_cuda() ? "" : " (or --device cpu was given)"));
    if (id.empty()) throw Error("--nnodes " + std::to_string(nnodes) + ": node 0's build has no NCCL");
    go.size = int(local);
    go.rank0 = int(node_rank * local);
    go.world = int(tp);
    go.nccl_id = id;
    go.links = std::move(joined.links);
    return std::make_unique<engine::RankGroup>(std::move(go), load);
  }
  if (lo.device.is_cuda() && lo.cpu_fallback) {
    // --device auto: a model the CUDA kernels cannot run goes to the CPU on every rank.
    const std::string why = model::cuda_shape_problem(cfg, int(tp));
    if (!why.empty()) {
      SIEVE_LOG(Warn, "--device auto: " << dir << " runs on the CPU, not " << lo.device.str() << ": " << why);
      go.device = Device{};
    }
  }
  return std::make_unique<engine::RankGroup>(std::move(go), load);
}

bool follow_node_zero(engine::RankGroup& g) {
  if (!g.follows_another_node()) return false;
  SIEVE_LOG(Info, "following node 0's steps (HTTP and the engine run there)");
  g.follow();
  SIEVE_LOG(Info, "node 0 ended the run");
  return true;
}

std::function<void(uint64_t, uint64_t)> load_progress_printer(const std::string& what) {
  using clock = std::chrono::steady_clock;
  struct State {
    clock::time_point start = clock::now();
    std::unique_ptr<Progress> bar;
  };
  auto st = std::make_shared<State>();
  return [st, what](uint64_t done, uint64_t total) {
    if (!st->bar) {
      // Loads that take under a second show nothing.
      if (done >= total || std::chrono::duration<double>(clock::now() - st->start).count() < 1.0) return;
      st->bar = std::make_unique<Progress>(ProgressOptions{.label = what, .total = total, .bytes = true});
    }
    st->bar->set(done);
    if (done >= total) st->bar->finish();
  };
}

}  // namespace sieve::cli
