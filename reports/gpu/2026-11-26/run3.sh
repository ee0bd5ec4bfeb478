#!/usr/bin/env bash
# The third GPU run of 2026-11-26: the qualification runbook itself, whole, as a user runs it
# (`nsa-validate run runbooks/gpu_kernels.yaml`, default grid), to measure its real time and verdict. A second
# call on the same warm machine continues an interrupted run with --resume. Time left over: bench_attention with
# the FlexAttention path beside the Triton path and dense.
# Calls made: `BUDGET=480 run3.sh 1` (the CLI could not start: /usr/local/bin/nsa-validate is another Python's,
# without typer; the flex benchmark
# ran: attn_flex.*), then `SKIP_FLEX=1 BUDGET=510 run3.sh 5` (python3 -m validation.cli; carry=[artifacts/wheels],
# typer and shellingham wheels from `pip download --no-deps`, not needed in the end): gpu_kernels_run/.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin
OUT=${OUT:-/tmp/gpu_out3}; mkdir -p "$OUT"; RD=artifacts/validate/gk; BUDGET=${BUDGET:-480}
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 -m pip install -q --no-deps --no-build-isolation -e . > /dev/null 2>&1
# the GPU image's python3 lacks the CLI's typer: wheels carried from the workstation (artifacts/wheels)
[ -d artifacts/wheels ] && python3 -m pip install -q --no-index --find-links artifacts/wheels typer rich > "$OUT/pip$1.txt" 2>&1
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; date -u; } > "$OUT/env$1.txt" 2>&1
if [ -f $RD/results.json ]; then MODE="--resume $RD"; else MODE="--out $RD"; fi
timeout -s TERM -k 30 $BUDGET python3 -m validation.cli run runbooks/gpu_kernels.yaml $MODE > "$OUT/run$1_log.txt" 2>&1
RC=$?  # (the run of 03:21 printed "exit 0" here: $? was read after $(el) had reset it; its verdict was NO-GO, exit 1)
echo "[$(el)s] nsa-validate exit $RC ($MODE)" | tee -a "$OUT/run$1_log.txt"
LEFT=$(( BUDGET + 40 - $(el) ))
if [ -z "${SKIP_FLEX:-}" ] && [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c \
    --paths nsa-flex,nsa-triton,dense --seq-lens 2048,65536 --json "$OUT/attn_flex.json" > "$OUT/attn_flex$1.txt" 2>&1
  echo "[$(el)s] bench_attention flex exit $?" >> "$OUT/run$1_log.txt"
fi
tar czf "$OUT/gk$1.tgz" -C artifacts/validate gk 2>/dev/null
ls -la "$OUT"; tail -40 "$OUT/run$1_log.txt"
