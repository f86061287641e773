#!/usr/bin/env bash
# One command on a GPU machine for the FP8 MoE kernels (moe_fp8*.cu, moe_route.cu): build with CUDA,
# the MoE parity tests (kernels_cuda_moe_test, the MoE tests of kernels_cuda_dense_test and of the
# CPU suite), compute-sanitizer memcheck on the CUDA ones, the register / spill report and the
# SASS instruction counts of the FP8 kernels, and the bench rows "moe experts" (bf16), "moe experts
# fp8" and "moe route + router gemm". Everything lands in OUTDIR (summary.txt last, then the bench table).
#
#   scripts/gpu-moe-fp8.sh OUTDIR
#
# The whole run takes longer than one 10-minute device call; on a lent machine run it in four
# calls on the same warm machine (the build directory stays; later calls find it built), each
# appending to OUT/summary.txt:
#   SKIP_TESTS=1 SKIP_SANITIZER=1 SKIP_BENCH=1 scripts/gpu-moe-fp8.sh OUT  # build only
#   SKIP_SANITIZER=1 SKIP_BENCH=1 scripts/gpu-moe-fp8.sh OUT   # registers/SASS, parity tests
#   SKIP_TESTS=1 SKIP_BENCH=1 scripts/gpu-moe-fp8.sh OUT       # compute-sanitizer memcheck
#   SKIP_TESTS=1 SKIP_SANITIZER=1 scripts/gpu-moe-fp8.sh OUT   # bench rows
#
# Environment: SIEVE_BUILD_DIR (default build-gpu), SIEVE_JOBS (default: all cores), BENCH_ITERS
# (default 50), SKIP_TESTS=1 (also skips the register / SASS report), SKIP_BENCH=1,
# SKIP_SANITIZER=1, SANITIZER_TIMEOUT (seconds per run, default 170:
# three runs fit one call), TEST_TIMEOUT
# (seconds per test binary, default 540), BENCH_TIMEOUT (default 540),
# COMPUTE_SANITIZER (the tool's path), CUDA_HOME (default /usr/local/cuda).
set -uo pipefail

out=${1:?usage: scripts/gpu-moe-fp8.sh OUTDIR}
mkdir -p "$out"
out=$(cd "$out" && pwd)
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SIEVE_BUILD_DIR:-$root/build-gpu}
jobs=${SIEVE_JOBS:-$(nproc)}
cuda=${CUDA_HOME:-/usr/local/cuda}
summary=$out/summary.txt  # appended to by each call
note() { echo "$*" | tee -a "$summary"; }

if [ ! -f "$root/.deps/googletest/CMakeLists.txt" ] && [ -d /usr/src/googletest ]; then
  mkdir -p "$root/.deps" && cp -r /usr/src/googletest "$root/.deps/googletest"
fi
commit=$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo "${SIEVE_COMMIT:-unknown}")
note "gpu-moe-fp8 $(date -u '+%Y-%m-%d %H:%M UTC') commit $commit"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>/dev/null | sed 's/^/gpu: /' | tee -a "$summary"

start=$(date +%s)
{
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSIEVE_CUDA=ON &&
    cmake --build "$build" -j"$jobs" --target sieve kernels_cuda_moe_test kernels_cuda_dense_test kernels_cpu_test
} >"$out/build.log" 2>&1
note "build: rc=$? ($(($(date +%s) - start)) s)"
if [ ! -x "$build/tests/kernels/kernels_cuda_moe_test" ] || [ ! -x "$build/sieve" ]; then
  note "build failed: see build.log"
  tail -30 "$out/build.log"
  exit 1
fi

if [ "${SKIP_TESTS:-0}" != 1 ]; then
# Registers, spills and stack of every FP8 MoE kernel (ptxas), and their SASS: QGMMA (fp8 wgmma)
# must appear in the tile and stream kernels; LDL/STL count local-memory traffic.
nvflags=(-DSIEVE_HAVE_CUBLAS=1 -DSIEVE_HAVE_CUDA=1 -I"$root/src" -O3 -DNDEBUG
  -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -lineinfo -std=c++20 -x cu)
: >"$out/resources.txt"
: >"$out/sass.txt"
for f in moe_fp8_tile moe_fp8_stream moe_fp8 moe_route; do
  "$cuda/bin/nvcc" "${nvflags[@]}" -Xptxas -v -c "$root/src/kernels/cuda/$f.cu" -o "$out/$f.o" >>"$out/resources.txt" 2>&1
  if [ -x "$cuda/bin/cuobjdump" ]; then
    "$cuda/bin/cuobjdump" -sass "$out/$f.o" >"$out/$f.sass" 2>&1
    echo "$f: QGMMA $(grep -c QGMMA "$out/$f.sass"), HGMMA $(grep -c HGMMA "$out/$f.sass"), HMMA $(grep -c HMMA "$out/$f.sass"), LDL $(grep -c 'LDL' "$out/$f.sass"), STL $(grep -c 'STL' "$out/$f.sass"), UTMALDG $(grep -c UTMALDG "$out/$f.sass")" >>"$out/sass.txt"
  fi
  rm -f "$out/$f.o"
done
grep -E "registers|spill" "$out/resources.txt" | paste - - | sed 's/ptxas info *: //g' | sort | uniq -c >"$out/resources-short.txt"
note "ptxas: $(grep -c 'spill stores' "$out/resources.txt") kernels, $(grep -E '[1-9][0-9]* bytes spill stores' -c "$out/resources.txt") with spills (resources.txt)"
[ -s "$out/sass.txt" ] && sed 's/^/sass: /' "$out/sass.txt" | tee -a "$summary"

# Parity tests (each run capped: a hang shows as rc=124 and the last test started in the log).
cap_test=${TEST_TIMEOUT:-540}
start=$(date +%s)
timeout "$cap_test" "$build/tests/kernels/kernels_cuda_moe_test" >"$out/test-cuda-moe.log" 2>&1
note "kernels_cuda_moe_test: rc=$? ($(($(date +%s) - start)) s): $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/test-cuda-moe.log" | tr '\n' ' ')"
note "  last test started: $(grep '^\[ RUN' "$out/test-cuda-moe.log" | tail -1)"
timeout "$cap_test" "$build/tests/kernels/kernels_cuda_dense_test" --gtest_filter='*Moe*' >"$out/test-cuda-dense-moe.log" 2>&1
note "kernels_cuda_dense_test (MoE): rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/test-cuda-dense-moe.log" | tr '\n' ' ')"
"$build/tests/kernels/kernels_cpu_test" --gtest_filter='*Moe*:*Linear*:*Quantize*' >"$out/test-cpu-moe.log" 2>&1
note "kernels_cpu_test (MoE): rc=$?: $(grep -E '^\[  (PASSED|FAILED)  \]' "$out/test-cpu-moe.log" | tr '\n' ' ')"
grep -E "Failure|FAILED|gpu .* cpu|elements outside" "$out/test-cuda-moe.log" | head -20 | sed 's/^/  /' | tee -a "$summary"
fi

# compute-sanitizer memcheck on the CUDA MoE tests (the model-shape cases take longest).
if [ "${SKIP_SANITIZER:-0}" != 1 ]; then
  san=${COMPUTE_SANITIZER:-$cuda/bin/compute-sanitizer}
  command -v "$san" >/dev/null 2>&1 || san=compute-sanitizer
  cap=${SANITIZER_TIMEOUT:-170}
  for spec in "kernels_cuda_moe_test:-*ModelShapes*" "kernels_cuda_moe_test:*ModelShapes*" "kernels_cuda_dense_test:*Moe*"; do
    bin=${spec%%:*}
    filter=${spec#*:}
    log="$out/memcheck-$bin-$(echo "$filter" | tr -dc 'A-Za-z').log"
    start=$(date +%s)
    timeout "$cap" "$san" --tool memcheck --error-exitcode 9 "$build/tests/kernels/$bin" --gtest_filter="$filter" >"$log" 2>&1
    rc=$?
    note "memcheck $bin $filter: rc=$rc ($(($(date +%s) - start)) s): $(grep -E 'ERROR SUMMARY' "$log" | tail -1)"
  done
fi

# Bench rows: the bf16 MoE (for comparison), the FP8 MoE and the routing.
if [ "${SKIP_BENCH:-0}" != 1 ]; then
start=$(date +%s)
timeout "${BENCH_TIMEOUT:-540}" "$build/sieve" bench kernels --rows "moe " --iters "${BENCH_ITERS:-50}" --json "$out/bench.json" \
  --md "$out/bench.md" >"$out/bench.log" 2>&1
note "bench: rc=$? ($(($(date +%s) - start)) s)"
grep -E "FP8 matrix rate" "$out/bench.log" | tee -a "$summary"
cat "$out/bench.md" 2>/dev/null
fi
