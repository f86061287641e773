#!/usr/bin/env bash
# Runs train_tiny_m3.py on the GPU machine and packs what it wrote into $OUT (see README.md).
# Usage (from the repository root, with .corpus/ made by extract_corpus.py carried along):
#   bash tests/reference/device_run.sh [--smoke] [more train_tiny_m3.py options]
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader
TF=$(python3 -c "import transformers, os; print(os.path.dirname(transformers.__file__))")
# The installed MiniMax-M3 sources, for docs/transformers-m3.md (read only, never committed).
tar -C "$TF" -cf "$OUT/tfsrc.tar" models/minimax_m3_vl integrations/sdpa_attention.py masking_utils.py 2>/dev/null || true
RUN=/tmp/m3run
rm -rf "$RUN"
python3 tests/reference/train_tiny_m3.py --out "$RUN" "$@" 2>&1 | tee "$OUT/log.txt"
rc=${PIPESTATUS[0]}
# Files come back at most 16 MiB each: pack everything and split it in 15 MiB parts.
tar -C "$RUN" -cf /tmp/result.tar . && split -b 15M -d /tmp/result.tar "$OUT/result.tar.part-" || true
echo "exit code $rc"
exit $rc
