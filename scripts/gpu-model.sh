#!/usr/bin/env bash
# One command on a GPU machine for the model at its real size (issue 44): build, the GPU model
# tests, `sieve bench step` at real shapes for one tensor-parallel rank, and serving the real
# width on one GPU with `sieve bench serve`. Everything lands in OUTDIR; summary.txt has the lines
# to read first.
#
#   scripts/gpu-model.sh OUTDIR
#
# Steps (each can be skipped: SKIP_BUILD=1, SKIP_TESTS=1, SKIP_PERPLEXITY=1, SKIP_STEP=1, SKIP_SERVE=1):
# 1. build.log: sieve and model_cuda_test with CUDA (SIEVE_BUILD_DIR, default build-gpu).
# 2. tests.log: ctest -L gpu -R 'ModelCuda|GoldenCuda' (the bundled model on the GPU, tiny MXFP8
#    and 128x128 FP8 checkpoints against the CPU, --quantization fp8, shapes refused at load,
#    dummy weights at the real width); perplexity-{bf16,fp8}.json: the bundled model's held-out
#    perplexity on the GPU with BF16 weights and with --quantization fp8.
# 3. step-tp8.{txt,json}: bench step, real config, dummy MXFP8 weights, one rank of 8 (~54 GB:
#    fits an H100), batch 32, context 9216, fp8 KV and index caches, index_topk_freq 4, and an
#    8192-token prefill chunk. step-tp4.*: the same for one rank of 4 (~108 GB) when the GPU has
#    more than 120 GB (an H200). step-tp8-blocks128.*, step-tp4-blocks128.*: the same with the
#    MXFP8 scales regrouped to 128 x 128 blocks (--fp8-scale-blocks 128x128).
# 4. serve.log, serve-c{1,8,32}.json, step-serve.{txt,json}: `sieve serve --load-format dummy`
#    of the real config cut to SERVE_LAYERS layers (default 8: 3 dense + 5 MoE; 6 if the experts
#    are still BF16), `sieve bench serve` 8192 in / 1024 out at concurrency 1, 8 and 32
#    (SERVE_PROMPTS requests each, default 3 x concurrency), and bench step on the same cut model
#    at batch 32 and the mean context of that run (8704) to compare TPOT with. The vocabulary is
#    cut to the tokenizer's (models/minimax-m3-tiny, 6144 ids: the M3 tokenizer is not in the
#    repository), which leaves out most of lm_head's 200064 rows in both runs alike.
#
# Environment: SIEVE_BIN (the sieve binary to run; default the build's), SIEVE_JOBS (build jobs, default all cores), SERVE_PORT (default 8123),
# STEP_ITERS (default 20), SIEVE_COMMIT (commit to report when the tree has no .git).
set -uo pipefail

out=${1:?usage: scripts/gpu-model.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SIEVE_BUILD_DIR:-$root/build-gpu}
jobs=${SIEVE_JOBS:-$(nproc)}
sieve=${SIEVE_BIN:-$build/sieve}  # SIEVE_BIN: a binary built elsewhere (with the text stack and server)
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

commit=${SIEVE_COMMIT:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)}
note "gpu-model $(date -u '+%Y-%m-%d %H:%M UTC') commit $commit"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"
mem_mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1 | tr -d ' ')
mem_mib=${mem_mib:-0}

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  if [ ! -f "$root/.deps/googletest/CMakeLists.txt" ] && [ -d /usr/src/googletest ]; then
    mkdir -p "$root/.deps" && cp -r /usr/src/googletest "$root/.deps/googletest"
  fi
  start=$(date +%s)
  {
    cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_CUDA=ON &&
      cmake --build "$build" -j"$jobs" --target sieve model_cuda_test
  } >"$out/build.log" 2>&1
  note "build: rc=$? ($(($(date +%s) - start)) s)"
fi
if [ ! -x "$sieve" ]; then
  note "no $sieve: see build.log"
  tail -30 "$out/build.log" 2>/dev/null
  exit 1
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
  start=$(date +%s)
  (cd "$build" && ctest -L gpu -R 'ModelCuda|GoldenCuda' -V --timeout 600) >"$out/tests.log" 2>&1
  note "gpu model tests: rc=$? ($(($(date +%s) - start)) s): $(grep -E 'tests passed|tests failed' "$out/tests.log" | tail -1)"
  # -V keeps what passing tests print (ctest prefixes each line with the test's number).
  grep -E '^([0-9]+: )?\[ (fp8|dummy|cuda|graphs) \]' "$out/tests.log" | sed -E 's/^[0-9]+: //' | sort -u | tee -a "$summary"
fi

if [ "${SKIP_PERPLEXITY:-0}" != 1 ]; then
  # The bundled model's held-out perplexity on the GPU, BF16 weights vs --quantization fp8.
  for q in bf16 fp8; do
    flag=""
    if [ $q = fp8 ]; then flag="--quantization fp8"; fi
    "$sieve" eval perplexity --model "$root/models/minimax-m3-tiny" --file "$root/data/heldout/heldout.txt" \
      --device cuda $flag --json >"$out/perplexity-$q.json" 2>"$out/perplexity-$q.err"
    note "perplexity $q weights (GPU, bf16 caches): rc=$? $(cat "$out/perplexity-$q.json")"
  done
fi

iters=${STEP_ITERS:-20}
step() {  # name, then bench step arguments
  local name=$1
  shift
  local start
  start=$(date +%s)
  "$sieve" bench step "$@" --iters "$iters" >"$out/$name.txt" 2>&1
  local rc=$?
  "$sieve" bench step "$@" --iters "$iters" --json >"$out/$name.json" 2>"$out/$name.err"
  note "bench step $name: rc=$rc ($(($(date +%s) - start)) s)"
  grep -E 'weights |  step |projected TPOT|TPOT on one' "$out/$name.txt" | sed 's/^/  /' | tee -a "$summary"
}

if [ "${SKIP_STEP:-0}" != 1 ]; then
  step step-tp8 --tp-rank-of 8
  step step-tp8-blocks128 --tp-rank-of 8 --fp8-scale-blocks 128x128
  if [ "$mem_mib" -gt 122880 ]; then
    step step-tp4 --tp-rank-of 4
    step step-tp4-blocks128 --tp-rank-of 4 --fp8-scale-blocks 128x128
  else
    note "bench step tp4: skipped (one rank of 4 needs ~108 GB; this GPU has $mem_mib MiB)"
  fi
fi

if [ "${SKIP_SERVE:-0}" != 1 ]; then
  layers=${SERVE_LAYERS:-8}
  port=${SERVE_PORT:-8123}
  overrides="{\"num_hidden_layers\": $layers, \"vocab_size\": 6144, \"use_index_cache\": true, \"index_topk_freq\": 4}"
  "$sieve" serve --model "$root/configs/minimax-m3" --load-format dummy --tokenizer "$root/models/minimax-m3-tiny" \
    --hf-overrides "$overrides" --kv-cache-dtype fp8 --max-model-len 9216 --max-num-seqs 32 --port "$port" \
    --disable-log-requests >"$out/serve.log" 2>&1 &
  server=$!
  up=0
  for _ in $(seq 1 300); do
    if curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
      up=1
      break
    fi
    if ! kill -0 "$server" 2>/dev/null; then break; fi
    sleep 2
  done
  if [ "$up" != 1 ]; then
    note "serve ($layers layers): did not come up; serve.log:"
    tail -20 "$out/serve.log" | tee -a "$summary"
  else
    note "serve ($layers layers of the real width, dummy weights): up; $(grep -E 'weights:|memory on' "$out/serve.log" | sed 's/.*INFO[^ ]* [^ ]* //' | tr '\n' ' ')"
    for c in 1 8 32; do
      n=${SERVE_PROMPTS:-$((3 * c))}
      start=$(date +%s)
      "$sieve" bench serve --port "$port" --random-input-len 8192 --random-output-len 1024 --ignore-eos \
        --random-vocab-size 6144 --num-prompts "$n" --max-concurrency "$c" --num-warmups 1 --disable-tqdm \
        --save-result --result-dir "$out" --result-filename "serve-c$c.json" >"$out/serve-c$c.txt" 2>&1
      note "bench serve c=$c: rc=$? ($(($(date +%s) - start)) s): $(grep -iE 'mean tpot|median tpot|output token throughput' "$out/serve-c$c.txt" | tr -s ' ' | tr '\n' ';')"
    done
  fi
  kill "$server" 2>/dev/null
  wait "$server" 2>/dev/null
  step step-serve --tp-rank-of 1 --batch 32 --context 8704 --hf-overrides "$overrides"
fi
note "done: $out"
