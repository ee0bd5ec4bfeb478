#!/usr/bin/env bash
# Run 5 (H100, 2026-11-26): after run 4 (gpu_kernels.yaml on an H100, cut before its trainer step), in one call:
# 1. the glue file's tests, whose fp32 layer test failed in run 4 (the range and selected kernels took TF32 dots for
#    fp32 operands), with the fix (common.dot_precision), and the precision wiring tests;
# 2. the trainer benchmark (run 4 did not reach it) with the Triton index build now the default on CUDA;
# 3. the layer forward+backward with each index build (NSA_INDEX_BUILD), Triton first.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; date -u; } > "$OUT/env.txt" 2>&1
timeout 110 python3 -m pytest -q -p no:cacheprovider tests/nsa/attention/kernels/test_triton_glue.py \
    tests/nsa/attention/kernels/test_dot_precision.py > "$OUT/glue.txt" 2>&1
RC=$?; echo "[$(el)s] glue tests exit $RC" | tee -a "$OUT/log.txt"
timeout 120 python3 benchmarks/bench_train.py --device cuda --modes eager,graphs --json "$OUT/train.json" \
    > "$OUT/train.txt" 2>&1
RC=$?; echo "[$(el)s] bench_train exit $RC" | tee -a "$OUT/log.txt"
for build in triton torch; do
  NSA_INDEX_BUILD=$build timeout 60 python3 benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c \
      --paths nsa-triton --seq-lens 2048,65536 --json "$OUT/attn_index_$build.json" > "$OUT/attn_index_$build.txt" 2>&1
  RC=$?; echo "[$(el)s] bench_attention NSA_INDEX_BUILD=$build exit $RC" | tee -a "$OUT/log.txt"
done
tail -5 "$OUT/glue.txt"; tail -12 "$OUT/train.txt"; tail -6 "$OUT"/attn_index_*.txt
