#!/usr/bin/env bash
# The next GPU session's script (written 2026-11-26 after run 6 on an H100, reports/gpu/2026-11-26-h100, where the
# runbook ended GO; not run yet in this form). On the device machine, from the repository root, two calls of up to
# 10 minutes (outputs under $OUT):
#     PART=1 BUDGET=590 bash reports/gpu/next_run.sh   # runbooks/gpu_kernels.yaml whole (8 min 12 s on an H100 from a
#                                                      # cold cache in run 6), now with the Triton index build as
#                                                      # the default; a second PART=1 call on the same warm machine
#                                                      # continues it (--resume)
#     PART=2 BUDGET=300 bash reports/gpu/next_run.sh   # the trainer with --compile (both models), then
#                                                      # benchmarks/tune_kernels.py with the time left
# 15 minutes of device time hold PART 1 (~9 min with the start) and a PART 2 of about 5 minutes.
# The runbook runs through `python3 -m validation.cli`: the image's nsa-validate script belongs to another Python.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; RD=artifacts/validate/gk; BUDGET=${BUDGET:-560}; PART=${PART:-1}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; date -u; } > "$OUT/env.txt" 2>&1
if [ "$PART" = 1 ]; then
  if [ -f $RD/results.json ]; then MODE="--resume $RD"; else MODE="--out $RD"; fi
  timeout -s TERM -k 30 $(( BUDGET - 40 )) python3 -m validation.cli run runbooks/gpu_kernels.yaml $MODE \
      > "$OUT/gk_console.txt" 2>&1
  RC=$?
  echo "[$(el)s] gpu_kernels exit $RC ($MODE)" | tee -a "$OUT/gk_console.txt"
  tar czf "$OUT/gk.tgz" -C artifacts/validate gk 2>/dev/null
  tail -25 "$OUT/gk_console.txt"
  exit 0
fi
# PART 2: the trainer's --compile mode, which the runbook leaves out (on the H200 it was the dense twin's fastest
# mode), then the launch-configuration tuner of the two kernels that dominate at 65,536 with the time left.
timeout 200 python3 benchmarks/bench_train.py --device cuda --modes compile --json "$OUT/train_compile.json" \
    > "$OUT/train_compile.txt" 2>&1
RC=$?; echo "[$(el)s] bench_train --modes compile exit $RC" | tee -a "$OUT/log.txt"
LEFT=$(( BUDGET - 20 - $(el) ))
if [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 benchmarks/tune_kernels.py --device cuda --families range_dkdv,sel_bwd --json "$OUT/tune.json" \
      > "$OUT/tune.txt" 2>&1
  RC=$?; echo "[$(el)s] tune_kernels exit $RC" | tee -a "$OUT/log.txt"
fi
tail -6 "$OUT/train_compile.txt"; tail -15 "$OUT/tune.txt" 2>/dev/null
