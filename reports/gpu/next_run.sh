#!/usr/bin/env bash
# The next GPU session's script (PART=kernels rewritten 2026-11-30 after the H200 run of reports/gpu/2026-11-30-h200,
# for issues 31 and 32). From the repository root, outputs under $OUT (at most 8 files come back: each part tars its
# folder after every step, so a cut call keeps what ran). Calls of at most 10 minutes, in this order:
#     PART=kernels BUDGET=570 bash reports/gpu/next_run.sh     # ~9.5 min (timeout_s 595; a start took ~30 s)
#     PART=selection BUDGET=200 bash reports/gpu/next_run.sh   # ~3 min (its A/B first: the rest ran 2026-11-30)
#     PART=trainer BUDGET=540 bash reports/gpu/next_run.sh     # ~9 min
#     PART=h100 BUDGET=560 bash reports/gpu/next_run.sh        # ~9 min: h100_single whole but its kernel phase
#     PART=choices BUDGET=560 bash reports/gpu/next_run.sh     # ~9 min: issue 31 items 2.3-2.6's launch choices
#                                                              # (what does not fit in BUDGET is skipped and logged)
# 15 minutes of device time hold PART=kernels twice and a start; PART=trainer waits for the next GPU session (or
# follows on the same warm machine where time is left). A second PART=kernels call on a warm machine
# continues its runbook (--resume). A step starts only when its time is left (never cut short to fit another);
# what was skipped says so in log.txt. The runbook runs through `python3 -m validation.cli` (the image's
# nsa-validate script belongs to another Python).
#
# PART=kernels
#   K3  PART=selection's A/B of the topk choice (below), which did not fit on 2026-11-30: the selection alone, then
#       the layer, alternated (~2.5 min). First, as the largest pending forward change: at 65,536 on the H200 the
#       sort choice's radix sort took 3.2 of the forward's 17.2 ms, and aten glue 4.6 ms, the sort choice's `where`
#       and fill passes among it, which the topk choice does not launch (reports/gpu/2026-11-30-h200).
#   K2  runbooks/gpu_kernels.yaml without its trainer phase (--skip trainer_bench): the kernel tests each file in
#       its own process, memcheck of every kernel, the layer against dense, and the roofline profile (7 min 40 s on
#       the H200 on 2026-11-30, where every criterion passed but the kernel tests': 12 tests of
#       test_triton_selected.py built the index from CPU tensors, fixed since). Expected verdict: INCOMPLETE on the
#       skipped trainer criterion alone, every kernel criterion passed. It does not finish in the first call after
#       K3: a second PART=kernels call on the warm machine (~4 min) resumes it and skips K3.
#   (K1, the range dK/dV default w4s1_split in the whole layer against the shipped tile, alternated: done on
#   2026-11-30, faster in both rounds at 65,536 B 1, 0.807 and 0.803 of fwd+bwd, and 2,048 B 8, 0.834 and 0.909.)
# PART=selection (issue 31 item 2.2: the packed-key topk choice, nsa.attention.selection.TOPK_CHOICE: the keys
#       kernel, torch.topk and, since 2026-11-29, _blocksel_finish_kernel for the kept indices; against the
#       full sort; the default stays "sort" until this qualifies it)
#   S1  its tests on the GPU (each file in its own process), and test_triton_selection.py under the topk choice;
#   S2  memcheck of the selection kernels under the topk choice (qualify, bf16, S 2,048 and 65,536, hpg 1 and 6);
#   S3  the selection alone, alternated (bench_selection.py --topk-ab), then the layer with each choice alternated
#       (bench_attention.py --topk-choice) at 65,536 B 1.
# PART=h100 (issue 32 item 4): runbooks/h100_single.yaml whole, its kernel phase taken from a gpu_kernels run of
#       the same source (`--reuse kernels`): PART=kernels' run on this machine when there is one, else a committed
#       one under reports/ whose source digest is this tree's (results.json records it since 2026-11-28: commit K2's
#       run as reports/gpu/<date>/gpu_kernels_run, and a later session at the same source can reuse it), else the
#       phase is skipped (--skip kernels) and the run ends INCOMPLETE on its criteria alone. Its report, HTML and
#       results.json are the GPU example (reports/examples/h100_single/).
# PART=choices (issue 31 items 2.3-2.6, written 2026-11-29 without a GPU: each new choice sits beside the shipped
#       kernel and 'auto' keeps the shipped one until this qualifies it; reports/aot/range_query_occupancy.md,
#       selected_bwd_dq.md, selected_fwd_occupancy.md and selected_band.md hold their ahead-of-time registers and
#       CTAs per SM)
#   C1  numerics of every choice on the GPU in bf16 against float64, each test file in its own process (the slow
#       cases run by default there): range forward/dQ tiles (QUERY_CHOICES), the selected backward's query-outer
#       dQ (DQ_CHOICES), its per-pair partial output (OUT_CHOICES), the fused host glue (HOST_CHOICES), the
#       kv forward's register-lean 64-row tile (FWD_TILE_CHOICES m64_w4) and, last, the forced blocks through the
#       range kernels' band merged by lse (FORCED_CHOICES band, 2026-11-29);
#   C2  memcheck of the layer's kernels under each new choice (qualify.py, bf16, S 2,048, hpg 6);
#   C3  the layer with each new choice against the shipped one, alternated A B A B, one process per case, at S 65,536
#       B 1 (forward and backward), then at 2,048 B 8 with the time left;
#   C4  (time left) the range forward/dQ tiles timed on their own (tune_kernels --families range_q).
#   A choice becomes the default ('auto': QUALIFIED_QUERY, QUALIFIED_DQ, QUALIFIED_OUT, QUALIFIED_HOST,
#   QUALIFIED_FWD_TILE, QUALIFIED_FORCED) only where C1 and C2 are clean and C3 shows it faster in both rounds.
#   The band choice comes last in each of C1, C2 and C3's rounds, so the earlier choices' steps keep their place
#   in the budget; at 65,536 each round runs every choice before the next round starts.
# PART=trainer (125M model, bf16, CUDA graphs)
#   T0  the fused loss (NSA_LOSS=fused, 2026-11-29: each chunk's loss and logit gradient in one Triton kernel):
#       its tests on the GPU (bf16 against float64, CUDA graph capture), the fused ones again under memcheck, then
#       the loss alone at the trainer's head (16,384 tokens x 50,304, bf16 autocast), reference / chunked / fused
#       (and the kernel at two wider tiles) alternated (bench_loss.py);
#   T1  the dense twin with each change alone against the old step, alternated (2 repeats): the fused RoPE, the
#       fused AdamW and the fused loss (the chunked loss alone was 0.93x on 2026-11-28; not repeated);
#   T2  NSA against the dense twin at 16,384 and 32,768 tokens (B 1) with the new dK/dV default (issue 32's 2x);
#   T3  (with the time left) --compile and compile + CUDA graphs, both models, and the GPU test of the compiled
#       model's capture.
#
# After a call: `python3 benchmarks/ab_table.py $W/kernels $W/choices ...` (or the untarred folders with log.txt
# beside them) prints every A/B of K1, S3 and C3 as one table, each choice "faster in every round" or not, and the
# steps that failed or were skipped.
#
# DRY=DIR (no GPU needed): run nothing; each step writes its command, NUL-separated, to DIR/NNN_<step>.argv, which
# tests/test_next_run.py checks on CPU (every benchmark's options through its --dry-run, the runbook through
# `run --dry-run`, each pytest file and -k collected, each launch choice a module sets, qualify's options), so
# that a typo costs a CI run, not a GPU session.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin NSA_TB_DISABLE=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; BUDGET=${BUDGET:-570}; PART=${PART:-kernels}
W=${W:-/tmp/nsa_gpu}; mkdir -p $W/kernels $W/trainer; DRY=${DRY:-}; NSTEP=0
case $PART in kernels|selection|h100|choices|trainer) ;; *) echo "PART=$PART: expected kernels, selection, h100, choices or trainer" >&2; exit 2;; esac
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(el) )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/log.txt"; }
# step NAME SECONDS DIR CMD...: run CMD with a timeout of SECONDS (capped by what is left), output in DIR/NAME.txt
step() {
  local name=$1 need=$2 dir=$3; shift 3
  local cap=$(( $(left) - 15 ))
  if [ $cap -lt $(( need / 2 )) ]; then log "SKIPPED $name: ${cap}s left, it needs about ${need}s"; return 0; fi
  [ $need -lt $cap ] && cap=$need
  if [ -n "$DRY" ]; then
    NSTEP=$(( NSTEP + 1 )); mkdir -p "$DRY"; printf '%s\0' "$@" > "$DRY/$(printf %03d $NSTEP)_$name.argv"; return 0
  fi
  timeout -s TERM -k 10 $cap "$@" > "$dir/$name.txt" 2>&1
  log "$name exit $? (limit ${cap}s)"
  tar czf "$OUT/$(basename $dir).tgz" -C $W "$(basename $dir)"  # after every step: a cut call keeps what ran
}
[ -z "$DRY" ] && { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20; date -u
  python3 -c "from validation.version import source_digest; print('source digest', source_digest())"
} > "$OUT/env.txt" 2>&1

# the packed-key topk choice against the full sort: the selection alone, then the layer, alternated (step prefix $1)
topk_ab() {
  local pre=$1 dir=$2
  step "${pre}_topk_ab" 90 $dir python3 benchmarks/bench_selection.py --topk-ab --device cuda --seq-lens 2048,16384,65536 \
      --repeats 11 --json $dir/topk_ab.json
  for round in 1 2; do for choice in sort topk; do
    step "${pre}_layer_${choice}_r${round}_65536" 30 $dir python3 benchmarks/bench_attention.py --device cuda --dtype bf16 \
        --shape m7c --paths nsa-triton --seq-lens 65536 --batch 1 --topk-choice $choice --repeats 5 --warmup 2 \
        --json $dir/layer_${choice}_r${round}_65536.json
  done; done
}

if [ "$PART" = kernels ]; then
  K=$W/kernels
  # first: the pending default change the most forward time hangs on (a second call on the warm machine skips it)
  [ -f $K/layer_topk_r2_65536.json ] || topk_ab K3 $K
  RD=artifacts/validate/gk
  if [ -f $RD/results.json ]; then MODE="--resume $RD"; else MODE="--out $RD"; fi
  step K2_gpu_kernels 480 $K python3 -m validation.cli run runbooks/gpu_kernels.yaml --skip trainer_bench $MODE
  for f in report.md results.json junit.xml; do cp $RD/$f $K/ 2>/dev/null; done
  for f in layer_bench layer_profile; do cp $RD/$f/bench.json $K/$f.json 2>/dev/null; done
  tar czf "$OUT/kernels.tgz" -C $W kernels
fi

if [ "$PART" = selection ]; then
  K=$W/selection; mkdir -p $K
  topk_ab S3 $K  # first: tests and memcheck ran clean on the H200 on 2026-11-30, the A/B did not fit
  step S1_test_selection_topk 40 $K python3 -m pytest -q -p no:cacheprovider tests/nsa/attention/test_selection_topk.py
  step S1_test_triton_selection_topk 60 $K python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/attention/kernels/test_triton_selection_topk.py
  step S1_test_triton_selection_under_topk 90 $K python3 -c "import sys, pytest; from nsa.attention import selection; \
selection.TOPK_CHOICE = 'topk'; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', \
'tests/nsa/attention/kernels/test_triton_selection.py']))"
  for s in 2048 65536; do for h in 1 6; do
    step "S2_memcheck_topk_s${s}_hpg${h}" 40 $K compute-sanitizer --tool memcheck --launch-timeout 0 python3 -c \
        "import sys; from nsa.attention import selection; selection.TOPK_CHOICE = 'topk'; \
from nsa.attention.kernels import qualify; sys.exit(qualify.main(['--dtype', 'bf16', '--seq-len', '$s', '--hpg', '$h', \
'--kernels', 'select,sel_kv']))"
  done; done
fi

if [ "$PART" = h100 ]; then
  H=$W/h100; mkdir -p $H
  RD=artifacts/validate/gk; HD=artifacts/validate/h100
  # the first of: this machine's gpu_kernels run, a committed one of the same source; else the phase is skipped
  MODE=$(python3 - "$RD" "$HD" <<'PY' 2> $H/reuse_check.txt
import sys
from pathlib import Path
from validation.results import reuse
from validation.runbook import loader as runbook
rd, hd = sys.argv[1], sys.argv[2]
if Path(hd, "results.json").is_file():
    print(f"--resume {hd}"); sys.exit()
rb = runbook.load_runbook(Path("runbooks/h100_single.yaml"))
for where in ([Path(rd)] if Path(rd, "results.json").is_file() else []) + [None]:
    try:
        reuse.resolve(rb, {"kernels": where}, (), Path("."))
        print(f"--out {hd} --reuse kernels" + (f"={where}" if where else "")); sys.exit()
    except reuse.ReuseError as exc:
        print(exc, file=sys.stderr)
print(f"--out {hd} --skip kernels")
PY
)
  log "h100_single: $MODE"
  step H1_h100_single 530 $H python3 -m validation.cli run runbooks/h100_single.yaml $MODE
  for f in report.md report.html results.json junit.xml; do cp $HD/$f $H/ 2>/dev/null; done
  tar czf "$OUT/h100.tgz" -C $W h100
fi

if [ "$PART" = choices ]; then
  C=$W/choices; mkdir -p $C
  for f in test_range_query_choices test_selected_dq_choices test_selected_fwd_tile_choices \
           test_selected_band_choice test_selected_fused_casts test_range_glue_choice; do
    step "C1_$f" 120 $C python3 -m pytest -q -p no:cacheprovider tests/nsa/attention/kernels/$f.py
  done
  # (option module constant value): the process-wide choice each memcheck sets before the layer's kernels run
  for sel in "range_attn.host QUERY_CHOICE bn32" "range_attn.host QUERY_CHOICE m64_bn32" \
             "selected_attn.host DQ_CHOICE query" "selected_attn.host OUT_CHOICE partial" \
             "selected_attn.host HOST_CHOICE fused" "selected_attn.host FWD_TILE_CHOICE m64_w4" \
             "selected_attn.host FORCED_CHOICE band" "range_attn.host GLUE_CHOICE fused"; do
    set -- $sel
    step "C2_memcheck_${2}_${3}" 60 $C compute-sanitizer --tool memcheck --launch-timeout 0 python3 -c \
        "import sys, importlib; setattr(importlib.import_module('nsa.attention.kernels.$1'), '$2', '$3'); \
from nsa.attention.kernels import qualify; \
sys.exit(qualify.main(['--dtype', 'bf16', '--seq-len', '2048', '--hpg', '6']))"
  done
  for shape in "65536 1" "2048 8"; do
    set -- $shape
    for round in 1 2; do
      for opt in "query-choice bn32" "query-choice m64_bn32" "sel-dq-choice query" "sel-out-choice partial" \
                 "sel-host-choice fused" "sel-tile-choice m64_w4" "sel-forced-choice band" \
                 "range-glue-choice fused"; do
        o=${opt% *}; v=${opt#* }
        for arm in shipped new; do
          [ $arm = shipped ] && val=auto || val=$v
          step "C3_${o}_${v}_${arm}_r${round}_$1b$2" 30 $C python3 benchmarks/bench_attention.py --device cuda \
              --dtype bf16 --shape m7c --paths nsa-triton --seq-lens $1 --batch $2 --$o $val --repeats 5 --warmup 2 \
              --json $C/${o}_${v}_${arm}_r${round}_$1b$2.json
        done
      done
    done
  done
  step C4_range_q_tiles 150 $C python3 benchmarks/tune_kernels.py --device cuda --all --families range_q \
      --candidates bn32,bn32_s3,m64_bn32,1 --seq-lens 65536,2048 --batch 1,8 --repeats 5 --warmup 1 --timeout 120 \
      --json $C/range_q_tiles.json
  tar czf "$OUT/choices.tgz" -C $W choices
fi

if [ "$PART" = trainer ]; then
  T=$W/trainer
  step T0_loss_tests 90 $T python3 -m pytest -q -p no:cacheprovider tests/nsa/test_loss.py
  step T0_loss_memcheck 120 $T compute-sanitizer --tool memcheck --launch-timeout 0 python3 -m pytest -q \
      -p no:cacheprovider tests/nsa/test_loss.py -k fused
  step T0_loss 90 $T python3 benchmarks/bench_loss.py --device cuda --repeats 10 \
      --fused-configs 8192x16,16384x32 --json $T/loss.json
  OLD="NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=reference"
  step T1_dense_each_change 240 $T python3 benchmarks/bench_train.py --device cuda --models dense --modes graphs \
      --repeats 2 --variant "old:$OLD" --variant "rope:NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=fused" \
      --variant "adam:NSA_OPT_FUSED=1,NSA_LOSS=reference,NSA_ROPE=reference" \
      --variant "loss:NSA_OPT_FUSED=0,NSA_LOSS=fused,NSA_ROPE=reference" --json $T/dense_each_change.json
  step T2_long_context 120 $T python3 benchmarks/bench_train.py --device cuda --modes graphs --contexts 16384,32768 \
      --json $T/long_context.json
  step T3_compile 200 $T python3 benchmarks/bench_train.py --device cuda --modes compile,compile+graphs \
      --json $T/compile.json
  step T3_test_compiled_capture 120 $T python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/training/test_cuda_graphs.py -k compiled_model
fi
log "done"
tail -n 12 $W/kernels/*.txt 2>/dev/null | cut -c1-200
tail -n 12 $W/selection/*.txt $W/choices/*.txt $W/trainer/*.txt 2>/dev/null | cut -c1-220
