#!/usr/bin/env bash
# Run 4 (H100, 2026-11-26): this script as reports/gpu/next_run.sh stood at 8b266be, called as
#     BUDGET=550 bash reports/gpu/next_run.sh
# (the runbook got BUDGET - 60 = 490 s and was cut by its timeout before its last step, train_bench).
# The next GPU session's script (written 2026-11-26, not run yet): on the device machine, from the repository root,
#     BUDGET=540 bash reports/gpu/next_run.sh          # one call of up to 10 minutes; outputs under $OUT
# 1. runbooks/gpu_kernels.yaml whole (default grid; ~8 min on an H200 from a cold Triton cache), through
#    `python3 -m validation.cli`: the image's nsa-validate script belongs to another Python (no torch, no typer).
#    A second call on the same warm machine continues it (--resume) if the first was cut.
# 2. with the time left: benchmarks/tune_kernels.py (candidate launch configurations against the shipped ones).
# Everything lands in $OUT: env.txt, console logs, the run directory as gk.tgz, tune.json.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; RD=artifacts/validate/gk; BUDGET=${BUDGET:-540}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; date -u; } > "$OUT/env.txt" 2>&1
if [ -f $RD/results.json ]; then MODE="--resume $RD"; else MODE="--out $RD"; fi
timeout -s TERM -k 30 $(( BUDGET - 60 )) python3 -m validation.cli run runbooks/gpu_kernels.yaml $MODE \
    > "$OUT/gk_console.txt" 2>&1
RC=$?
echo "[$(el)s] gpu_kernels exit $RC ($MODE)" | tee -a "$OUT/gk_console.txt"
LEFT=$(( BUDGET - 20 - $(el) ))
if [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 benchmarks/tune_kernels.py --device cuda --families range_dkdv,sel_bwd --json "$OUT/tune.json" \
      > "$OUT/tune.txt" 2>&1
  RC=$?
  echo "[$(el)s] tune_kernels exit $RC" >> "$OUT/gk_console.txt"
fi
tar czf "$OUT/gk.tgz" -C artifacts/validate gk 2>/dev/null
tail -25 "$OUT/gk_console.txt"
