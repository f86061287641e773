#include "kernels/cuda/tuning.h"

#include <cstdlib>
#include <functional>

#include "core/error.h"

namespace sieve::cuda {

namespace {
Tuning g_tuning;

int parse_int(const std::string& name, const std::string& v) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (v.empty() || *end != '\0') throw Error("tuning field " + name + ": \"" + v + "\" is not an integer");
  return int(x);
}
bool parse_bool(const std::string& name, const std::string& v) {
  if (v == "1" || v == "true" || v == "on") return true;
  if (v == "0" || v == "false" || v == "off") return false;
  throw Error("tuning field " + name + ": \"" + v + "\" is not true / false (1 / 0)");
}

struct Field {
  const char* name;
  std::function<void(Tuning&, const std::string&)> set;
  std::function<std::string(const Tuning&)> get;
};

#define SIEVE_INT_FIELD(group, field)                                                            \
  Field {                                                                                        \
    #group "." #field, [](Tuning& t, const std::string& v) { t.group.field = parse_int(#group "." #field, v); }, \
        [](const Tuning& t) { return std::to_string(t.group.field); }                            \
  }
#define SIEVE_BOOL_FIELD(group, field)                                                           \
  Field {                                                                                        \
    #group "." #field, [](Tuning& t, const std::string& v) { t.group.field = parse_bool(#group "." #field, v); }, \
        [](const Tuning& t) { return std::string(t.group.field ? "true" : "false"); }            \
  }

const std::vector<Field>& fields() {
  using Mma = IndexerTuning::PrefillMma;
  static const std::vector<Field> f = {
      SIEVE_INT_FIELD(launch, pdl_mask),
      SIEVE_INT_FIELD(launch, chain_pdl),
      SIEVE_INT_FIELD(launch, l2_prefetch_mib),
      SIEVE_INT_FIELD(linear, backend),
      SIEVE_INT_FIELD(linear, wgs),
      SIEVE_INT_FIELD(linear, bn),
      SIEVE_INT_FIELD(linear, splits),
      SIEVE_INT_FIELD(linear, stages),
      SIEVE_INT_FIELD(linear, max_ctas_per_sm),
      SIEVE_BOOL_FIELD(linear, pdl),
      SIEVE_INT_FIELD(linear, fuse_quant_max_m),
      SIEVE_BOOL_FIELD(indexer, narrow_mma),
      SIEVE_INT_FIELD(indexer, l2_evict_first),
      SIEVE_BOOL_FIELD(indexer, trace),
      SIEVE_INT_FIELD(indexer, chunked_max_chunks),
      SIEVE_INT_FIELD(indexer, cluster_size),
      SIEVE_INT_FIELD(indexer, cluster_groups),
      SIEVE_INT_FIELD(indexer, cluster_budget_kb),
      SIEVE_INT_FIELD(indexer, cluster_max_stages),
      SIEVE_BOOL_FIELD(indexer, cluster_merge_ilp),
      SIEVE_INT_FIELD(indexer, persistent_unit),
      SIEVE_INT_FIELD(indexer, persistent_stages),
      SIEVE_INT_FIELD(indexer, persistent_grid),
      SIEVE_INT_FIELD(indexer, persistent_statics),
      SIEVE_INT_FIELD(indexer, persistent_ctas_per_sm),
      SIEVE_BOOL_FIELD(indexer, persistent_early_copies),
      SIEVE_BOOL_FIELD(indexer, persistent_poll),
      SIEVE_INT_FIELD(indexer, persistent_long_unit),
      SIEVE_INT_FIELD(indexer, persistent_claim_poll),
      Field{"indexer.prefill_mma",
            [](Tuning& t, const std::string& v) {
              if (v == "auto") t.indexer.prefill_mma = Mma::kAuto;
              else if (v == "ss") t.indexer.prefill_mma = Mma::kSS;
              else if (v == "rs") t.indexer.prefill_mma = Mma::kRS;
              else if (v == "rsp") t.indexer.prefill_mma = Mma::kRSP;
              else throw Error("tuning field indexer.prefill_mma: \"" + v + "\" is not auto, ss, rs or rsp");
            },
            [](const Tuning& t) {
              switch (t.indexer.prefill_mma) {
                case Mma::kSS: return std::string("ss");
                case Mma::kRS: return std::string("rs");
                case Mma::kRSP: return std::string("rsp");
                default: return std::string("auto");
              }
            }},
      SIEVE_BOOL_FIELD(indexer, prefill_overlap),
      SIEVE_INT_FIELD(indexer, prefill_setup_units),
      SIEVE_INT_FIELD(attention, max_cluster),
      SIEVE_INT_FIELD(attention, max_stages),
      SIEVE_INT_FIELD(attention, splits),
      SIEVE_INT_FIELD(attention, consumer_groups),
      SIEVE_INT_FIELD(attention, q_bulk),
      SIEVE_INT_FIELD(attention, l2_evict_first),
      SIEVE_BOOL_FIELD(attention, flagged_merge),
      SIEVE_INT_FIELD(attention, trace),
      SIEVE_INT_FIELD(attention, prefill_tiles),
      SIEVE_BOOL_FIELD(attention, prefill_solo),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage_scales),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage_max_mib),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage_fold),
      SIEVE_INT_FIELD(attention, prefill_fp8_qk),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage_pdl),
      SIEVE_INT_FIELD(attention, prefill_fp8_stage_only),
      Field{"moe.chunk_tokens", [](Tuning& t, const std::string& v) { t.moe.chunk_tokens = parse_int("moe.chunk_tokens", v); },
            [](const Tuning& t) { return std::to_string(t.moe.chunk_tokens); }},
      SIEVE_BOOL_FIELD(moe, force_simt),
      SIEVE_INT_FIELD(moe, tile_rows),
      SIEVE_INT_FIELD(moe, fp8_path),
      SIEVE_INT_FIELD(moe, fp8_stream_pairs_per_expert),
      SIEVE_INT_FIELD(moe, fp8_stream_rows),
      SIEVE_INT_FIELD(moe, fp8_ksplit_gate_up),
      SIEVE_INT_FIELD(moe, fp8_ksplit_down),
      SIEVE_INT_FIELD(moe, fp8_stream_kblocks),
      SIEVE_BOOL_FIELD(moe, fp8_pdl),
      SIEVE_BOOL_FIELD(moe, fp8_sort_pdl),
      SIEVE_BOOL_FIELD(moe, fp8_sort_scan),
      SIEVE_BOOL_FIELD(moe, fp8_map_cache),
      SIEVE_INT_FIELD(moe, fp8_ksplit_waves),
      SIEVE_INT_FIELD(moe, fp8_stream_experiment),
      SIEVE_INT_FIELD(moe, fp8_tile_experiment),
      SIEVE_BOOL_FIELD(moe, fp8_tile_block_scales),
      SIEVE_INT_FIELD(moe, fp8_tile_staged_out),
      SIEVE_BOOL_FIELD(moe, fp8_tile_dynamic),
      SIEVE_BOOL_FIELD(moe, fp8_tile_kmajor_scales),
      SIEVE_BOOL_FIELD(moe, fp8_tile_bulk_scales),
      SIEVE_BOOL_FIELD(moe, fp8_tile_param_maps),
      Field{"moe.route_fused_max_tokens",
            [](Tuning& t, const std::string& v) { t.moe.route_fused_max_tokens = parse_int("moe.route_fused_max_tokens", v); },
            [](const Tuning& t) { return std::to_string(t.moe.route_fused_max_tokens); }},
      Field{"moe.route_splitk_max_tokens",
            [](Tuning& t, const std::string& v) { t.moe.route_splitk_max_tokens = parse_int("moe.route_splitk_max_tokens", v); },
            [](const Tuning& t) { return std::to_string(t.moe.route_splitk_max_tokens); }},
      Field{"moe.route_splitk_warps",
            [](Tuning& t, const std::string& v) {
              const long long w = parse_int("moe.route_splitk_warps", v);
              if (w != 4 && w != 8) throw Error("tuning field moe.route_splitk_warps: \"" + v + "\" is not 4 or 8");
              t.moe.route_splitk_warps = int(w);
            },
            [](const Tuning& t) { return std::to_string(t.moe.route_splitk_warps); }},
  };
  return f;
}
#undef SIEVE_INT_FIELD
#undef SIEVE_BOOL_FIELD
}  // namespace

const Tuning& tuning() { return g_tuning; }
void set_tuning(const Tuning& t) { g_tuning = t; }

void set_tuning_field(Tuning& t, const std::string& name, const std::string& value) {
  for (const Field& f : fields())
    if (name == f.name) return f.set(t, value);
  throw Error("unknown tuning field " + name + " (sieve bench kernels --tune list lists them)");
}

std::vector<std::string> tuning_field_names() {
  const Tuning defaults;
  std::vector<std::string> names;
  for (const Field& f : fields()) names.push_back(std::string(f.name) + " (default " + f.get(defaults) + ")");
  return names;
}

}  // namespace sieve::cuda
