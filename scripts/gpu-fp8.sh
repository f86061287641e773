#!/usr/bin/env bash
# The FP8 GEMM (ops::linear) on a GPU machine in one command: build, the CPU reference and host
# emulation tests, the CUDA parity tests of linear and the quantizers (and the dense ops' test,
# whose rms_norm / swiglu_oai gained FP8 outputs), compute-sanitizer memcheck and racecheck on
# them, the SASS of the FP8 kernels (QGMMA present, no local memory), and the "fp8 linear" rows
# of `sieve bench kernels`. Everything lands in OUTDIR; summary.txt is printed last.
#
#   scripts/gpu-fp8.sh OUTDIR
#
# A device command may run 10 minutes: build and test in one call, the rest in later calls on the
# same warm machine (its build directory is kept, so the build step is then a no-op):
#   SKIP_SANITIZERS=1 SKIP_BENCH=1 scripts/gpu-fp8.sh OUT/a   # build, tests, SASS
#   SKIP_TESTS=1 SKIP_BENCH=1 scripts/gpu-fp8.sh OUT/b        # memcheck, racecheck (<= 8 min)
#   SKIP_TESTS=1 SKIP_SANITIZERS=1 scripts/gpu-fp8.sh OUT/c   # the bench rows (~2-4 min)
#
# Environment: SIEVE_BUILD_DIR (default build-gpu), SIEVE_JOBS (default: all cores), SKIP_TESTS=1,
# BENCH_ITERS (default 100), TEST_TIMEOUT (seconds per test binary, default 240), BENCH_TIMEOUT
# (default 420), SANITIZER_TIMEOUT (seconds per tool, default 240), SANITIZER_FILTER (memcheck's
# gtest filter; default the tests that reach every kernel), SKIP_BENCH=1,
# SKIP_SANITIZERS=1, COMPUTE_SANITIZER / CUOBJDUMP (the tools' paths).
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
  grep -E '^\[  FAILED  \]|Failure|cuBLASLt block scaling accepted' "$out/$name.log" | head -20 | sed 's/^/  /' | tee -a "$summary"
}
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  run_test cpu "$tests/kernels_cpu_test" 'Cpu*Linear*:CpuQuantizeFp8.*:CpuFusedQuantize.*:LinearEmulation.*:CpuRmsNorm*:CpuSwiglu*'
  run_test linear "$tests/kernels_cuda_linear_test"
  run_test dense "$tests/kernels_cuda_dense_test"
fi

if [ "${SKIP_SANITIZERS:-0}" != 1 ]; then
  cs=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
  to=${SANITIZER_TIMEOUT:-240}
  # memcheck: the tests that reach every kernel instantiation (forced plans), the quantizers and
  # cuBLASLt; racecheck: a few. When the parity tests failed, memcheck's report is the lead.
  mem="CudaLinearFp8.DiagnosticOneHotRows:CudaLinearFp8.ForcedPlans:CudaLinearFp8.AccumulateAndOutputDtypes"
  mem="$mem:CudaLinearFp8.UnalignedRowsAndModelShapes:CudaLinearFp8.CublasLtBlockScaling:CudaQuantizeFp8.*"
  mem="$mem:CudaRmsNormFp8.*:CudaSwigluFp8.*"
  race="CudaLinearFp8.DiagnosticOneHotRows:CudaLinearFp8.AccumulateAndOutputDtypes:CudaSwigluFp8.*"
  for spec in "memcheck|${SANITIZER_FILTER:-$mem}" "racecheck|$race"; do
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
  timeout "${BENCH_TIMEOUT:-420}" "$build/sieve" bench kernels --filter "fp8 linear" --rows "fp8" --iters "${BENCH_ITERS:-100}" --json "$out/bench.json" \
    --md "$out/bench.md" >"$out/bench.log" 2>&1
  note "bench: rc=$? ($(($(date +%s) - s)) s)"
  head -1 "$out/bench.log" | tee -a "$summary"
  # One line a shape: decode as graphs of 16 calls, prefill eager; time in us and time / floor
  # (decode target <= 1.3, prefill <= 1.67 = 60 % of the FP8 rate).
  python3 - "$out/bench.json" <<'PY' | tee -a "$summary"
import json, sys
rows = json.load(open(sys.argv[1]))["rows"]
rate = [r for r in rows if r["kernel"].startswith("fp8 matrix rate")]
if rate: print("fp8 rate: %s (%.1f us for 8192^3)" % (rate[0]["target_note"], rate[0]["us"]))
cols = [("own 1x128", "fp8 linear", "1x128 |"), ("own 1x128 2wg", "fp8 linear", "1x128 2wg |"),
        ("own bf16x", "fp8 linear", "1x128 bf16 x |"), ("own 128x128", "fp8 linear", "128x128 |"),
        ("lt rowwise", "fp8 linear, cuBLASLt rowwise", ""), ("lt block", "fp8 linear, cuBLASLt 1x128/128x128", "")]
table = {}
for r in rows:
    if not r["kernel"].startswith("fp8 linear"): continue
    decode = not r["shape"].endswith("m8192")
    if decode != r["mode"].endswith("graph x16"): continue
    for name, kernel, prefix in cols:
        if r["kernel"] == kernel and r["mode"].startswith(prefix):
            table.setdefault(r["shape"], {})[name] = (r["us"], r["ratio"])
print("%-36s" % "shape" + "".join("%18s" % c[0] for c in cols))
for shape, v in table.items():
    print("%-36s" % shape + "".join("%18s" % ("%.1f (%.2f)" % v[c[0]] if c[0] in v else "-") for c in cols))
PY
fi
echo
echo "==== summary ($out/summary.txt)"
cat "$summary"
