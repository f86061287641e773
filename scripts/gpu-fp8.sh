#!/usr/bin/env bash
# The FP8 GEMM (ops::linear) on a GPU machine in one command: build, the CPU reference and host
# emulation tests, the CUDA parity tests of linear and the quantizers (and the dense ops' test,
# whose rms_norm / swiglu_oai gained FP8 outputs), compute-sanitizer memcheck on a few tests
# (racecheck on request), the SASS of the FP8 kernels (QGMMA present, no local memory), and the
# "fp8 linear" rows of `sieve bench kernels` with a side-by-side summary of the knobs'
# alternatives. Everything lands in OUTDIR; summary.txt is printed last.
#
#   scripts/gpu-fp8.sh OUTDIR          # all of it, ~4 min on an H100 with a warm build dir
#
# Environment: SIEVE_BUILD_DIR (default build-gpu), SIEVE_JOBS (default: all cores), SKIP_TESTS=1,
# SKIP_SANITIZERS=1, RACECHECK=1 (also racecheck a few tests), SKIP_BENCH=1, BENCH_ITERS
# (default 60), BENCH_FILTER (default "fp8 linear"; e.g. "fp8 linear tp4" for TP4 only),
# BENCH_TUNE (passed to --tune, e.g. linear.pdl=0), TEST_TIMEOUT (seconds per test binary,
# default 240), BENCH_TIMEOUT (default 300), SANITIZER_TIMEOUT (seconds per tool, default 150),
# SANITIZER_FILTER (memcheck's gtest filter), COMPUTE_SANITIZER / CUOBJDUMP (the tools' paths).
set -uo pipefail

out=${1:?usage: scripts/gpu-fp8.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SIEVE_BUILD_DIR:-$root/build-gpu}
jobs=${SIEVE_JOBS:-$(nproc)}
summary=$out/summary.txt
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

if [ ! -f "$root/.deps/googletest/CMakeLists.txt" ] && [ -d /usr/src/googletest ]; then
  mkdir -p "$root/.deps" && cp -r /usr/src/googletest "$root/.deps/googletest"
fi
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)
note "gpu-fp8 $(date -u '+%Y-%m-%d %H:%M UTC') commit $commit"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"

start=$(date +%s)
{
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_CUDA=ON &&
    cmake --build "$build" -j"$jobs" --target sieve kernels_cpu_test kernels_cuda_linear_test kernels_cuda_dense_test
} >"$out/build.log" 2>&1
note "build: rc=$? ($(($(date +%s) - start)) s)"
if [ ! -x "$build/tests/kernels/kernels_cuda_linear_test" ] || [ ! -x "$build/sieve" ]; then
  note "build failed: see build.log"
  tail -40 "$out/build.log"
  exit 1
fi
tests=$build/tests/kernels

# Each test binary and the bench run under a time limit (a hung kernel must not eat the session).
run_test() {  # name binary [gtest filter]
  local name=$1 bin=$2 filter=${3:-*} s
  s=$(date +%s)
  timeout "${TEST_TIMEOUT:-240}" "$bin" --gtest_filter="$filter" >"$out/$name.log" 2>&1
  local rc=$?
  note "$name: rc=$rc ($(($(date +%s) - s)) s): $(grep -E '^\[  (PASSED|FAILED|SKIPPED) ' "$out/$name.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|cuBLASLt block scaling accepted|tensor-core model' "$out/$name.log" | head -20 | sed 's/^/  /' | tee -a "$summary"
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test cpu "$tests/kernels_cpu_test" 'Cpu*Linear*:CpuQuantizeFp8.*:CpuFusedQuantize.*:LinearEmulation.*:TensorCoreModel.*:CpuRmsNorm*:CpuSwiglu*'
  run_test linear "$tests/kernels_cuda_linear_test"
  run_test dense "$tests/kernels_cuda_dense_test"
fi

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  to=${SANITIZER_TIMEOUT:-150}
  # memcheck: every path of the op (own kernel with both token sources and every tile shape,
  # programmatic dependent launch, cuBLASLt) on small shapes, and the quantizers.
  mem="CudaLinearFp8.DiagnosticOneHotRows:CudaLinearFp8.FusedQuantizationEqualsTheQuantizeKernel"
  mem="$mem:CudaLinearFp8.DependentLaunchesKeepTheOrder:CudaLinearFp8.UnalignedRowsAndModelShapes"
  mem="$mem:CudaLinearFp8.CublasLtBlockScaling:CudaQuantizeFp8.*:CudaSwigluFp8.*"
  specs=("memcheck|${SANITIZER_FILTER:-$mem}")
  [ "${RACECHECK:-0}" = 1 ] &&
    specs+=("racecheck|CudaLinearFp8.DiagnosticOneHotRows:CudaLinearFp8.FusedQuantizationEqualsTheQuantizeKernel")
  for spec in "${specs[@]}"; do
    tool=${spec%%|*}
    filter=${spec#*|}
    s=$(date +%s)
    timeout "$to" "$cs" --tool "$tool" --error-exitcode 99 "$tests/kernels_cuda_linear_test" --gtest_filter="$filter" \
      >"$out/$tool.log" 2>&1
    rc=$?
    note "$tool: rc=$rc ($(($(date +%s) - s)) s) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1)"
    grep -E '^=+ (Invalid|Error|Race|Address)' "$out/$tool.log" | sort | uniq -c | head -5 | sed 's/^/  /' | tee -a "$summary"
  done
fi

# SASS of the FP8 GEMM kernels: wgmma must appear as QGMMA; local memory (LDL/STL) must not.
ob=${CUOBJDUMP:-$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)}
lib=$(find "$build" -name 'libsieve_kernels.a' | head -1)
if [ -x "$ob" ] && [ -n "$lib" ]; then
  "$ob" -sass "$lib" >"$out/sass.txt" 2>/dev/null
  "$ob" -res-usage "$lib" 2>/dev/null | grep -A1 -E 'linear_fp8_kernel|quantize_rows_kernel|swiglu_fp8_kernel|rms_norm_kernel' >"$out/res-usage.txt"
  awk '/Function : /{name=$3} name ~ /linear_fp8_kernel/ {if ($0 ~ /QGMMA/) q[name]++; if ($0 ~ /LDL|STL/) l[name]++; seen[name]=1}
       END {for (n in seen) printf "  %s: QGMMA %d, LDL/STL %d\n", n, q[n], l[n]}' "$out/sass.txt" | sort | tee -a "$summary"
else
  note "sass: no cuobjdump ($ob) or library"
fi

if [ "${SKIP_BENCH:-0}" != 1 ]; then
  s=$(date +%s)
  tune=()
  [ -n "${BENCH_TUNE:-}" ] && tune=(--tune "$BENCH_TUNE")
  timeout "${BENCH_TIMEOUT:-300}" "$build/sieve" bench kernels --filter "${BENCH_FILTER:-fp8 linear}" --rows "fp8" \
    --iters "${BENCH_ITERS:-60}" "${tune[@]}" --json "$out/bench.json" --md "$out/bench.md" >"$out/bench.log" 2>&1
  note "bench: rc=$? ($(($(date +%s) - s)) s)"
  head -1 "$out/bench.log" | tee -a "$summary"
  # Per shape: time in us and time / floor (decode: graphs of 16 calls, target <= 1.3 x the bytes
  # floor; prefill: eager, target <= 1.67 = 60 % of the FP8 rate), one column per variant.
  python3 - "$out/bench.json" <<'PY' | tee -a "$summary"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
rate = [r for r in rows if r["kernel"].startswith("fp8 matrix rate")]
if rate: print("fp8 rate: %s (%.1f us for 8192^3)" % (rate[0]["target_note"], rate[0]["us"]))
def cell(r): return "%.1f (%.2f)" % (r["us"], r["ratio"]) if r.get("ratio") else "%.1f" % r["us"]
def table(title, cols, want):
    t = {}
    for r in rows:
        if not want(r): continue
        for name, kernel, label in cols:
            mode = r["mode"].split(" | ")[0]
            if r["kernel"] == kernel and (label is None or mode == label):
                t.setdefault(r["shape"], {})[name] = r
    if not t: return
    print("\n" + title)
    print("%-34s" % "shape" + "".join("%15s" % c[0] for c in cols))
    for shape, v in t.items():
        print("%-34s" % shape + "".join("%15s" % (cell(v[c[0]]) if c[0] in v else "-") for c in cols))
own = "fp8 linear"
dec = lambda r: not r["shape"].endswith("m8192") and r["mode"].endswith("graph x16")
pre = lambda r: r["shape"].endswith("m8192")
probe = ("probe", "read probe (fp8 linear's weight bytes)", None)
table("decode, FP8 rows (graph x16 per call): default | alternatives",
      [("default", own, "1x128"), ("no pdl", own, "1x128, no pdl"), ("1 cta/sm", own, "1x128, 1 cta/sm"),
       ("3 ctas/sm", own, "1x128, 3 ctas/sm"), ("4 stages", own, "1x128, 4 stages"),
       ("8 stages", own, "1x128, 8 stages"), ("128x128", own, "128x128"),
       ("lt block", "fp8 linear, cuBLASLt 1x128/128x128", None), ("lt rowwise", "fp8 linear, cuBLASLt rowwise", None)],
      lambda r: dec(r))
table("decode, BF16 rows (graph x16 per call)",
      [("default", own, "1x128 bf16 x"), ("fused quant", own, "1x128 bf16 x, fused quant"),
       ("no pdl", own, "1x128 bf16 x, no pdl")],
      lambda r: dec(r))
table("weight bytes read probe (graph x16 per call; floor and ratio at m1)", [probe], lambda r: True)
table("prefill m8192 (eager): default path per layout",
      [("128x128", own, "128x128"), ("1x128", own, "1x128"), ("1x128 bf16 x", own, "1x128 bf16 x"),
       ("own kernel", own, "128x128 own kernel"), ("lt rowwise", "fp8 linear, cuBLASLt rowwise", None)],
      lambda r: pre(r))
paths = sorted({(r["shape"], r["mode"].split(" | ")[1].split(" w")[0]) for r in rows
                if r["kernel"] == own and pre(r) and " | " in r["mode"] and not r["mode"].startswith("128x128 own")})
print("\nprefill paths: " + "; ".join("%s: %s" % p for p in paths))
PY
fi
echo
echo "==== summary ($out/summary.txt)"
cat "$summary"
