#!/usr/bin/env bash
# The GPU script (rewritten 2026-11-28 for issues 31 and 32). One call of at most 9 minutes on one H100/H200, from
# the repository root, outputs under $OUT (at most 8 files come back: each part tars its own):
#     BUDGET=530 bash reports/gpu/next_run.sh            # PART=all: kernels, then trainer, in one call
#     PART=kernels BUDGET=300 bash reports/gpu/next_run.sh
#     PART=trainer BUDGET=330 bash reports/gpu/next_run.sh
# A part starts only when the time it needs is left (never cut short to fit another); what was skipped says so in
# log.txt. Each kernel case runs in its own process (a fault kills one CUDA context only).
#
# PART=kernels (~3 min):
#   K1  range dK/dV's launch choices (range_attn/host.py DKDV_CHOICES) against float64 on the GPU, bf16;
#   K2  each choice against the shipped one, alternated, at 65,536 B 1 (benchmarks/tune_kernels.py: min / median /
#       max of each, the ratio, the outputs' difference);
#   K3  the layer's profile with the roofline: each kernel's time, forward and backward apart, against its floor;
#   K4, K5 (after the trainer part, with the time left) the choices at 2,048 B 8, and under memcheck.
# PART=trainer (~6 min):
#   T1  the old step against the new one (fused AdamW, chunked loss, fused RoPE), both models, alternated A B A B
#       (2 repeats, CUDA graphs, B 8 x 2,048);
#   T2  long context: NSA against the dense twin at 32,768 tokens (B 1), CUDA graphs, the new step;
#   T3  the dense twin with each change alone against the old step, alternated (2 repeats);
#   T4  (last, with the time left) the compiled model captured in CUDA graphs against it uncaptured (test).
# The runbook runs through `python3 -m validation.cli`: the image's nsa-validate script belongs to another Python.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin NSA_TB_DISABLE=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; BUDGET=${BUDGET:-530}; PART=${PART:-all}
W=/tmp/nsa_gpu; mkdir -p $W/kernels $W/trainer
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(el) )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/log.txt"; }
# step NAME SECONDS DIR CMD...: run CMD with a timeout of SECONDS (capped by what is left), output in DIR/NAME.txt
step() {
  local name=$1 need=$2 dir=$3; shift 3
  local cap=$(( $(left) - 15 ))
  if [ $cap -lt $(( need / 2 )) ]; then log "SKIPPED $name: ${cap}s left, it needs about ${need}s"; return 0; fi
  [ $need -lt $cap ] && cap=$need
  timeout -s TERM -k 10 $cap "$@" > "$dir/$name.txt" 2>&1
  log "$name exit $? (limit ${cap}s)"
  tar czf "$OUT/$(basename $dir).tgz" -C $W "$(basename $dir)"  # after every step: a cut call keeps what ran
}
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20; date -u; } > "$OUT/env.txt" 2>&1

if [ "$PART" = all ] || [ "$PART" = kernels ]; then
  K=$W/kernels
  step K1_test_range_dkdv_choices 60 $K python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/attention/kernels/test_range_dkdv_choices.py
  step K2_tune_range_dkdv_65536 90 $K python3 benchmarks/tune_kernels.py --device cuda --all --families range_dkdv \
      --candidates w4s1_split,split,bn32_w4_split,w4s1 --seq-lens 65536 --batch 1 --repeats 5 --warmup 1 \
      --timeout 60 --json $K/tune_range_dkdv_65536.json
  step K3_profile_roofline 70 $K python3 benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1 \
      --json $K/profile_roofline.json
fi

if [ "$PART" = all ] || [ "$PART" = trainer ]; then
  T=$W/trainer
  OLD="NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=reference"
  NEW="NSA_OPT_FUSED=1,NSA_LOSS=chunked,NSA_ROPE=fused"
  step T1_old_new 200 $T python3 benchmarks/bench_train.py --device cuda --modes graphs --repeats 2 \
      --variant "old:$OLD" --variant "new:$NEW" --json $T/old_new.json
  step T2_long_context 80 $T python3 benchmarks/bench_train.py --device cuda --modes graphs --contexts 32768 \
      --variant "new:$NEW" --json $T/long_context.json
  step T3_dense_each_change 150 $T python3 benchmarks/bench_train.py --device cuda --models dense --modes graphs \
      --repeats 2 --variant "old:$OLD" --variant "adam:NSA_OPT_FUSED=1,NSA_LOSS=reference,NSA_ROPE=reference" \
      --variant "loss:NSA_OPT_FUSED=0,NSA_LOSS=chunked,NSA_ROPE=reference" \
      --variant "rope:NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=fused" --json $T/dense_each_change.json
fi
# with the time left: range dK/dV at 2,048 B 8, and the candidates under compute-sanitizer memcheck
if [ "$PART" = all ] || [ "$PART" = kernels ]; then
  step K4_tune_range_dkdv_2048 70 $K python3 benchmarks/tune_kernels.py --device cuda --all --families range_dkdv \
      --candidates w4s1_split,split,bn32_w4_split,w4s1 --seq-lens 2048 --batch 8 --repeats 5 --warmup 1 \
      --timeout 40 --json $K/tune_range_dkdv_2048.json
  step K5_memcheck_dkdv_choices 80 $K compute-sanitizer --tool memcheck --launch-timeout 0 python3 -m pytest -q \
      -p no:cacheprovider tests/nsa/attention/kernels/test_range_dkdv_choices.py -k "float64"
fi
if [ "$PART" = all ] || [ "$PART" = trainer ]; then  # --compile with --cuda-graphs against --compile alone
  step T4_test_compiled_capture 150 $T python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/training/test_cuda_graphs.py -k compiled_model
fi
log "done"
tail -n 25 $W/kernels/*.txt 2>/dev/null | cut -c1-200
tail -n 12 $W/trainer/*.txt 2>/dev/null | cut -c1-220
