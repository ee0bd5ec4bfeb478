#!/usr/bin/env bash
# The next GPU session's script (written 2026-11-26 after runs 4 and 5 on an H100, reports/gpu/2026-11-26-h100; not
# run yet). On the device machine, from the repository root, two calls of up to 10 minutes (outputs under $OUT):
#     PART=1 BUDGET=560 bash reports/gpu/next_run.sh   # runbooks/gpu_kernels.yaml whole (~8 min before train_bench
#                                                      # on an H100 from a cold cache, + ~2 min for it); a second
#                                                      # PART=1 call on the same warm machine continues it (--resume)
#     PART=2 BUDGET=560 bash reports/gpu/next_run.sh   # the index builds A B A B, a profile with the Triton build,
#                                                      # one fp32-IEEE case under memcheck, then
#                                                      # benchmarks/tune_kernels.py with the time left
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
# PART 2: the selected branch's index, Triton build against torch build, alternated (run 5's one-shot comparison
# was confounded), then one profile with the Triton build, then the launch-configuration tuner.
for round in 1 2; do
  for build in triton torch; do
    NSA_INDEX_BUILD=$build timeout 90 python3 benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c \
        --paths nsa-triton --seq-lens 2048,65536 --json "$OUT/attn_index_${build}_$round.json" \
        > "$OUT/attn_index_${build}_$round.txt" 2>&1
    RC=$?; echo "[$(el)s] bench_attention NSA_INDEX_BUILD=$build round $round exit $RC" | tee -a "$OUT/log.txt"
  done
done
NSA_INDEX_BUILD=triton timeout 120 python3 benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1 --paths nsa-triton \
    --json "$OUT/profile_index_triton.json" > "$OUT/profile_index_triton.txt" 2>&1
RC=$?; echo "[$(el)s] profile_layer NSA_INDEX_BUILD=triton exit $RC" | tee -a "$OUT/log.txt"
# one fp32 case with IEEE products under memcheck (the runbook sanitises TF32 ones: the IEEE kernels spill with the
# bf16 tile sizes, and their time under memcheck is what this measures)
timeout 240 compute-sanitizer --tool memcheck --launch-timeout 0 python3 -m nsa.attention.kernels.qualify \
    --dtype fp32 --fp32-dots ieee --seq-len 65536 --hpg 6 > "$OUT/memcheck_fp32_ieee.txt" 2>&1
RC=$?; echo "[$(el)s] memcheck fp32 ieee S 65,536 hpg 6 exit $RC" | tee -a "$OUT/log.txt"
LEFT=$(( BUDGET - 20 - $(el) ))
if [ $LEFT -gt 60 ]; then
  timeout $LEFT python3 benchmarks/tune_kernels.py --device cuda --families range_dkdv,sel_bwd --json "$OUT/tune.json" \
      > "$OUT/tune.txt" 2>&1
  RC=$?; echo "[$(el)s] tune_kernels exit $RC" | tee -a "$OUT/log.txt"
fi
tail -4 "$OUT"/attn_index_*.txt
