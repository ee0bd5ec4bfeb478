#!/usr/bin/env bash
# The next GPU session's script (PART=kernels rewritten 2026-11-30 after the H200 run of reports/gpu/2026-11-30-h200,
# for issues 31 and 32; its A/Bs moved into one process per shape on 2026-12-01: benchmarks/bench_choices.py). From
# the repository root, outputs under $OUT (at most 8 files come back: each part tars its folder after every step, so
# a cut call keeps what ran). Calls of at most 10 minutes, in this order:
#     PART=kernels BUDGET=570 bash reports/gpu/next_run.sh     # ~9.5 min (timeout_s 595; a start took ~30 s)
#     PART=kernels BUDGET=240 bash reports/gpu/next_run.sh     # the same on the warm machine (timeout_s 260): what
#                                                              # did not end well, then gpu_kernels.yaml's first steps
#     PART=choices BUDGET=560 bash reports/gpu/next_run.sh     # ~9 min: every choice's numerics and memcheck
#     PART=trainer BUDGET=540 bash reports/gpu/next_run.sh     # ~9 min
#     PART=h100 BUDGET=560 bash reports/gpu/next_run.sh        # ~9 min: h100_single whole but its kernel phase
#     PART=selection BUDGET=200 bash reports/gpu/next_run.sh   # the topk choice's tests and memcheck again
#                                                              # (what does not fit in BUDGET is skipped and logged)
# 15 minutes of device time hold one PART=kernels call, a second one on the warm machine and a start (call it within
# the machine's 30 s idle release, with BUDGET at most the device time left minus a margin). A step that
# exited 0 leaves $W/<part>/.<step>.ok: a later call on the same warm machine logs it DONE and does not run it
# again, so a second call runs what failed, was cut or skipped (gpu_kernels.yaml continues with --resume). A step
# starts only when at least half of its estimated time is left (BUDGET less 15 s less the time spent), and runs
# until its estimate or that end, whichever is first (never cut short to fit another); what was skipped says so in
# log.txt. The runbook runs through `python3 -m validation.cli` (the image's nsa-validate script belongs to another
# Python). BUDGET is whole seconds (anything else is refused before anything runs, exit 2).
#
# PART=kernels
#   K3  the topk choice (nsa.attention.selection.TOPK_CHOICE: the keys kernel, torch.topk and _blocksel_finish_kernel
#       for the kept indices) against the full sort: the selection alone (bench_selection.py --topk-ab), then the
#       layer at 65,536 B 1 (bench_choices.py: 9 rounds, each a block of either kernel adjacent in time, ~1 min).
#       First, as the largest pending forward change: at 65,536 on the H200 the sort choice's radix sort took 3.2 of
#       the forward's 17.2 ms, and aten glue 4.6 ms, the sort choice's `where` and fill passes among it, which the
#       topk choice does not launch (reports/gpu/2026-11-30-h200). Its tests and memcheck ran clean there (S1, S2).
#   K4  issue 31 items 2.3-2.6's launch choices, each against the shipped kernels, in one process per shape
#       (bench_choices.py, 65,536 B 1 then 2,048 B 8; 9 rounds of adjacent blocks, ABBA): the range forward/dQ tiles
#       (QUERY_CHOICES bn32, m64_bn32), the selected backward's query-outer dQ (DQ_CHOICES query), its per-pair
#       partial output (OUT_CHOICES partial), the fused host glue (HOST_CHOICES fused), the kv forward's
#       register-lean 64-row tile (FWD_TILE_CHOICES m64_w4), the forced blocks through the range kernels' band merged
#       by lse (FORCED_CHOICES band), the range backward's fused glue (GLUE_CHOICES fused) and the selection's
#       importance loop (IMPORTANCE_CHOICES rows, 2026-12-01: a program walks all of its tokens' selection tiles,
#       q, lse, R and W loaded once, at one CTA per SM where the one-tile kernel has three; the one-tile kernel ran
#       at 10.6% of its floor; rows8, 8 tiles a program, is not measured here: a later run, if rows wins), the selected
#       backward on 4 warps (BWD_WARPS_CHOICES w4, 2026-12-01: 2 CTAs an SM where the shipped 8 warps hold 1;
#       _sel_bwd_kv was the layer's largest kernel, 7.59 ms at 6.6% of its floor); and an A/A arm
#       (the shipped kernels again: the noise floor). 9 rounds each, so that 20 comparisons with no effect give a
#       false "faster in every round" about 4% of the time (1 in 512 each). One process per case (bench_attention.py,
#       as until 2026-11-30) cost ~12 s a case on the H200: 64 cases, ~13 minutes; here the process start and the
#       layer are paid once per shape and each choice costs its compile and its passes (~2-4 min in all, estimated:
#       not yet measured). A choice that crashes the process (an illegal memory access) loses only itself: the step
#       continues its file in new processes until every choice has a verdict or an error; an arm whose loss or input
#       gradient is not the shipped kernels' is failed after its first round (no verdict).
#   K5  the choices faster in every round at one shape and not slower in every round at the other (failed at neither:
#       benchmarks/ab_table.py's qualifying_choices): their numerics on the GPU in bf16 against float64 (each
#       test file in its own process, the slow cases included there) and memcheck of the layer's kernels under each
#       (qualify.py, bf16, S 2,048, hpg 6). A choice becomes the default ('auto': QUALIFIED_QUERY, QUALIFIED_DQ,
#       QUALIFIED_OUT, QUALIFIED_HOST, QUALIFIED_FWD_TILE, QUALIFIED_FORCED, QUALIFIED_GLUE) only where K4 shows it
#       faster in every round and K5 is clean (reports/aot/range_query_occupancy.md, selected_bwd_dq.md,
#       selected_fwd_occupancy.md and selected_band.md hold their ahead-of-time registers and CTAs per SM).
#   K2  runbooks/gpu_kernels.yaml without its trainer phase (--skip trainer_bench): the kernel tests each file in
#       its own process, memcheck of every kernel, the layer against dense, and the roofline profile (7 min 40 s on
#       the H200 on 2026-11-30, where every criterion passed but the kernel tests': 12 tests of
#       test_triton_selected.py built the index from CPU tensors, fixed since). Expected verdict: INCOMPLETE on the
#       skipped trainer criterion alone, every kernel criterion passed. It starts in the second call (its first step,
#       the kernel tests, took 195 s: they include the 12 tests fixed since and the SDPA GQA test) and what is cut
#       keeps its finished steps; the rest waits for a later session (a fresh machine: run from the start).
#   (K1, the range dK/dV default w4s1_split in the whole layer against the shipped tile, alternated: done on
#   2026-11-30, faster in both rounds at 65,536 B 1, 0.807 and 0.803 of fwd+bwd, and 2,048 B 8, 0.834 and 0.909.)
# PART=selection (issue 31 item 2.2: the packed-key topk choice, nsa.attention.selection.TOPK_CHOICE: the keys
#       kernel, torch.topk and, since 2026-11-29, _blocksel_finish_kernel for the kept indices; against the
#       full sort; the default stays "sort" until this qualifies it)
#   S1  its tests on the GPU (each file in its own process), and test_triton_selection.py under the topk choice;
#   S2  memcheck of the selection kernels under the topk choice (qualify, bf16, S 2,048 and 65,536, hpg 1 and 6);
#   S3  K3 (run first: the tests and memcheck ran clean on the H200 on 2026-11-30; the A/B did not fit then).
# PART=h100 (issue 32 item 4): runbooks/h100_single.yaml whole, its kernel phase taken from a gpu_kernels run of
#       the same source (`--reuse kernels`): PART=kernels' run on this machine when there is one, else a committed
#       one under reports/ whose source digest is this tree's (results.json records it since 2026-11-28: commit K2's
#       run as reports/gpu/<date>/gpu_kernels_run, and a later session at the same source can reuse it), else the
#       phase is skipped (--skip kernels) and the run ends INCOMPLETE on its criteria alone. Its report, HTML and
#       results.json are the GPU example (reports/examples/h100_single/).
# PART=choices (issue 31 items 2.3-2.6, written 2026-11-29 without a GPU: each new choice sits beside the shipped
#       kernel and 'auto' keeps the shipped one until a GPU run qualifies it)
#   C1  K5 for every choice, winner or not: numerics (each test file in its own process), then memcheck under each
#       (the band choice last, so that the earlier choices' steps keep their place in the budget);
#   C3  K4's A/B, unless PART=kernels ran it on this machine;
#   C4  (time left) the range forward/dQ tiles timed on their own (tune_kernels --families range_q).
# PART=trainer (125M model, bf16, CUDA graphs)
#   T0  the fused loss (NSA_LOSS=fused, 2026-11-29: each chunk's loss and logit gradient in one Triton kernel):
#       its tests on the GPU (bf16 against float64, CUDA graph capture), the fused ones again under memcheck, then
#       the loss alone at the trainer's head (16,384 tokens x 50,304, bf16 autocast), reference / chunked / fused
#       (and the kernel at two wider tiles) alternated (bench_loss.py);
#   T1  the dense twin with each change alone against the old step, alternated (2 repeats): the fused RoPE, the
#       fused AdamW and the fused loss (the chunked loss alone was 0.93x on 2026-11-28; not repeated);
#   T2  NSA against the dense twin at 32,768 and 16,384 tokens (B 1) with the new dK/dV default (issue 32's 2x at
#       32,768 first: four cases of ~25-30 s each fill most of the step's 120 s, and a cut keeps what ran);
#   T3  (with the time left) --compile and compile + CUDA graphs, both models, and the GPU test of the compiled
#       model's capture.
#
# After a call: `python3 benchmarks/ab_table.py $W/kernels $W/choices ...` (or the untarred folders with log.txt
# beside them) prints every A/B of K3, K4, S3, C3 and T0/T1 as one table, each choice "faster in every round" or
# not, and the steps that failed or were skipped.
#
# DRY=DIR (no GPU needed): run nothing; each step writes its command, NUL-separated, to DIR/NNN_<step>.argv, which
# tests/test_next_run.py checks on CPU (every benchmark's options through its --dry-run, the runbook through
# `run --dry-run`, each pytest file and -k collected, each launch choice a module sets, qualify's options), so
# that a typo costs a CI run, not a GPU session.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD PATH=$PATH:/usr/local/cuda/bin NSA_TB_DISABLE=1
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"; BUDGET=${BUDGET:-570}; PART=${PART:-kernels}
W=${W:-/tmp/nsa_gpu}; mkdir -p "$W/kernels" "$W/trainer"; DRY=${DRY:-}; NSTEP=0
case $PART in kernels|selection|h100|choices|trainer) ;; *) echo "PART=$PART: expected kernels, selection, h100, choices or trainer" >&2; exit 2;; esac
case $BUDGET in *[!0-9]*|0*) echo "BUDGET=$BUDGET: expected the call's seconds, a whole number above 0 (e.g. 570)" >&2; exit 2;; esac
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
left() { echo $(( BUDGET - $(el) )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/log.txt"; }
# step NAME SECONDS DIR CMD...: run CMD with a timeout of SECONDS (capped by what is left), output in DIR/NAME.txt
step() {
  local name=$1 need=$2 dir=$3; shift 3
  local cap=$(( $(left) - 15 ))
  if [ -f "$dir/.$name.ok" ] && [ -z "$DRY" ]; then log "DONE $name: exit 0 in an earlier call on this machine"; return 0; fi
  if [ $cap -lt $(( need / 2 )) ]; then log "SKIPPED $name: ${cap}s left, it needs about ${need}s"; return 3; fi
  [ $need -lt $cap ] && cap=$need
  if [ -n "$DRY" ]; then
    NSTEP=$(( NSTEP + 1 )); mkdir -p "$DRY"; printf '%s\0' "$@" > "$DRY/$(printf %03d $NSTEP)_$name.argv"; return 0
  fi
  timeout -s TERM -k 10 $cap "$@" > "$dir/$name.txt" 2>&1
  local code=$?
  log "$name exit $code (limit ${cap}s)"
  [ $code -eq 0 ] && touch "$dir/.$name.ok"
  pack "$(basename "$dir")"  # after every step: a cut call keeps what ran
}
# $OUT/<folder>.tgz of $W/<folder>, written under another name and renamed: a call cut during the tar keeps the
# previous whole archive, never a truncated one
pack() { tar czf "$OUT/.$1.tgz.part" -C "$W" "$1" && mv -f "$OUT/.$1.tgz.part" "$OUT/$1.tgz"; }
[ -z "$DRY" ] && { nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader; nproc
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
  git rev-parse HEAD 2>/dev/null; git status --short 2>/dev/null | head -20; date -u
  python3 -c "from validation.version import source_digest; print('source digest', source_digest())"
} > "$OUT/env.txt" 2>&1

# the packed-key topk choice against the full sort: the selection alone, then the layer, alternated (step prefix $1)
topk_ab() {
  local pre=$1 dir=$2
  step "${pre}_topk_ab" 90 "$dir" python3 benchmarks/bench_selection.py --topk-ab --device cuda --seq-lens 2048,16384,65536 \
      --repeats 11 --json "$dir/topk_ab.json"
  step "${pre}_layer_topk_65536b1" 90 "$dir" python3 benchmarks/bench_choices.py --device cuda --dtype bf16 --shape m7c \
      --seq-len 65536 --batch 1 --arm sort=topk-choice:sort --arm topk=topk-choice:topk --rounds 9 --repeats 5 \
      --warmup 2 --json "$dir/layer_topk_65536b1.json" --resume "$dir/layer_topk_65536b1.json"
}

# issue 31 items 2.3-2.6's launch choices, each against the shipped kernels (arm NAME=FLAG:VALUE of bench_choices),
# and what qualifies each on the GPU: its test files (tests/nsa/attention/kernels/) and the module constant memcheck
# sets (module under nsa.attention.kernels, constant, value)
ARMS=(--arm shipped --arm shipped_again --arm query_bn32=query-choice:bn32 --arm query_m64_bn32=query-choice:m64_bn32
      --arm dq_query=sel-dq-choice:query --arm out_partial=sel-out-choice:partial
      --arm host_fused=sel-host-choice:fused --arm tile_m64_w4=sel-tile-choice:m64_w4
      --arm forced_band=sel-forced-choice:band --arm glue_fused=range-glue-choice:fused
      --arm imp_rows=sel-imp-choice:rows --arm bwd_w4=sel-bwd-warps-choice:w4)
declare -A TESTS=([query_bn32]=test_range_query_choices [query_m64_bn32]=test_range_query_choices
  [dq_query]=test_selected_dq_choices [out_partial]=test_selected_dq_choices
  [host_fused]="test_selected_dq_choices test_selected_fused_casts" [tile_m64_w4]=test_selected_fwd_tile_choices
  [forced_band]=test_selected_band_choice [glue_fused]=test_range_glue_choice
  [imp_rows]=test_triton_selection_rows [bwd_w4]=test_selected_bwd_warps_choice)
declare -A MEMCHECK=([query_bn32]="range_attn.host QUERY_CHOICE bn32" [query_m64_bn32]="range_attn.host QUERY_CHOICE m64_bn32"
  [dq_query]="selected_attn.host DQ_CHOICE query" [out_partial]="selected_attn.host OUT_CHOICE partial"
  [host_fused]="selected_attn.host HOST_CHOICE fused" [tile_m64_w4]="selected_attn.host FWD_TILE_CHOICE m64_w4"
  [forced_band]="selected_attn.host FORCED_CHOICE band" [glue_fused]="range_attn.host GLUE_CHOICE fused"
  [imp_rows]="selection.host IMPORTANCE_CHOICE rows 65536 select 6 sort|selection.host IMPORTANCE_CHOICE rows 65536 select 6 topk|selection.host IMPORTANCE_CHOICE rows 65536 select 1 sort"
  [bwd_w4]="selected_attn.host BWD_WARPS_CHOICE w4")
declare -A TEST_NEED=([test_triton_selection_rows]=240)  # its GPU-only cases compile the model's kernels in two dtypes
CHOICE_NAMES="query_bn32 query_m64_bn32 dq_query out_partial host_fused tile_m64_w4 forced_band glue_fused imp_rows
  bwd_w4"

# every choice against the shipped kernels in one process per shape, alternated (bench_choices: 9 rounds, each a
# block of the shipped kernels and one of the choice, adjacent; an A/A arm, shipped_again, for the noise floor); a
# crash (an illegal memory access ends the process) loses the arm in progress only: the step continues its file
# (--resume) in a new process until every arm has a verdict or an error, each process measuring at least one arm
# or recording it as crashed (an arm cut by the step's time limit is no crash: measured afresh by the next process);
# a process that leaves the file as it was (it failed before its first arm) is not followed by another; a later
# call on the warm machine continues it the same way
choices_ab() {
  local pre=$1 dir=$2 s b need j k name before
  for shape in "65536 1 240" "2048 8 180"; do
    set -- $shape; s=$1; b=$2; need=$3; j="$dir/choices_${s}b${b}.json"
    for k in 0 1 2 3 4 5 6 7 8 9 10 11 12; do
      name="${pre}_choices_${s}b${b}"; [ $k -gt 0 ] && name="${name}_resume$k"
      if [ -z "$DRY" ] && choices_done "$j"; then
        log "DONE ${pre}_choices_${s}b${b}: every arm has a verdict or an error"; break
      fi
      before=$(cksum "$j" 2>/dev/null)
      step "$name" $need "$dir" python3 benchmarks/bench_choices.py --device cuda --dtype bf16 --shape m7c \
          --seq-len $s --batch $b "${ARMS[@]}" --rounds 9 --repeats 5 --warmup 2 --json "$j" --resume "$j"
      [ $? -eq 3 ] && break  # skipped for time
      [ -n "$DRY" ] && [ $k -ge 1 ] && break  # DRY: the first command and one resume are checked
      if [ -z "$DRY" ] && [ "$(cksum "$j" 2>/dev/null)" = "$before" ]; then
        # it failed before measuring or recording any arm (its options, the layer, CUDA): a new process would too
        log "NOT RESUMED $name: it left $(basename "$j") as it was (see $name.txt)"; break
      fi
    done
  done
}

# whether bench_choices' JSON has every arm measured or failed, none in progress (no file: not done)
choices_done() {
  python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except (OSError, ValueError):
    sys.exit(1)
left = [a for a in d["arm_settings"] if a != d["baseline"] and not {"verdict", "error"} & set(d["arms"].get(a, {}))]
sys.exit(1 if left or d.get("in_progress") else 0)
PY
}

# the choices faster in every round at one shape and not slower in every round at the other (DRY: every choice, so
# that each command is checked); A/A arms never, nor a choice that failed at either shape (outputs not the
# shipped kernels', a crash), nor the figures of a file whose baseline changed (benchmarks/ab_table.py's
# qualifying_choices)
winners() {
  if [ -n "$DRY" ]; then echo $CHOICE_NAMES; return; fi
  python3 - "$@" <<'PY'
import sys
sys.path.insert(0, "benchmarks")
from ab_table import qualifying_choices
print(" ".join(qualifying_choices(sys.argv[1:])))
PY
}

# numerics (each test file in its own process, bf16 against float64) and memcheck (qualify, bf16, S 2,048, hpg 6)
# of the given choices (the importance loops at S 65,536 on the selection alone, where they walk 69 tiles a row, as
# PART=selection's S2 ran the topk choice): with the A/B, what makes a
# choice the default ('auto': its QUALIFIED_* constant)
qualify_choices() {
  local pre=$1 dir=$2 files="" f n spec specs seq only hpg topk tag
  shift 2
  for n in "$@"; do for f in ${TESTS[$n]:-}; do case " $files " in *" $f "*) ;; *) files="$files $f";; esac; done; done
  for f in $files; do
    step "${pre}_$f" ${TEST_NEED[$f]:-120} "$dir" python3 -m pytest -q -p no:cacheprovider tests/nsa/attention/kernels/$f.py
  done
  for n in "$@"; do
    specs=${MEMCHECK[$n]:-}
    [ -n "$specs" ] || { log "no memcheck known for the choice $n"; continue; }
    # each spec: module constant value [S [kernels [hpg [top-n_sel choice]]]]; S 2,048, every kernel, hpg 6 and the
    # shipped top-n_sel choice by default
    while IFS= read -r spec; do
      set -- $spec
      seq=${4:-2048}; only=""; hpg=${6:-6}; topk=${7:-auto}; tag=""
      [ -n "${5:-}" ] && only=", '--kernels', '$5'"
      [ $# -ge 6 ] && tag="_s${seq}_hpg${hpg}_${topk}"
      step "${pre}_memcheck_${2}_${3}${tag}" 60 "$dir" compute-sanitizer --tool memcheck --launch-timeout 0 python3 -c \
          "import sys, importlib; setattr(importlib.import_module('nsa.attention.kernels.$1'), '$2', '$3'); \
from nsa.attention import selection; selection.TOPK_CHOICE = '$topk'; \
from nsa.attention.kernels import qualify; \
sys.exit(qualify.main(['--dtype', 'bf16', '--seq-len', '$seq', '--hpg', '$hpg'$only]))"
    done < <(tr '|' '\n' <<< "$specs")
  done
}

if [ "$PART" = kernels ]; then
  K="$W/kernels"
  topk_ab K3 "$K"        # the pending change the most forward time hangs on
  choices_ab K4 "$K"     # every launch choice against the shipped kernels
  WIN=$(winners "$K/choices_65536b1.json" "$K/choices_2048b8.json")
  log "choices faster in every round: ${WIN:-none}"
  [ -n "$WIN" ] && qualify_choices K5 "$K" $WIN
  RD=artifacts/validate/gk
  if [ -f $RD/results.json ]; then MODE="--resume $RD"; else MODE="--out $RD"; fi
  # need 200: it starts in the second call with its time (its first step, the kernel tests, took 195 s), and what is
  # cut keeps its finished steps (--resume)
  step K2_gpu_kernels 200 "$K" python3 -m validation.cli run runbooks/gpu_kernels.yaml --skip trainer_bench $MODE
  for f in report.md results.json junit.xml; do cp $RD/$f "$K/" 2>/dev/null; done
  for f in layer_bench layer_profile; do cp $RD/$f/bench.json "$K/$f.json" 2>/dev/null; done
fi

if [ "$PART" = selection ]; then
  K="$W/selection"; mkdir -p "$K"
  topk_ab S3 "$K"  # first: tests and memcheck ran clean on the H200 on 2026-11-30, the A/B did not fit
  step S1_test_selection_topk 40 "$K" python3 -m pytest -q -p no:cacheprovider tests/nsa/attention/test_selection_topk.py
  step S1_test_triton_selection_topk 60 "$K" python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/attention/kernels/test_triton_selection_topk.py
  step S1_test_triton_selection_under_topk 90 "$K" python3 -c "import sys, pytest; from nsa.attention import selection; \
selection.TOPK_CHOICE = 'topk'; sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', \
'tests/nsa/attention/kernels/test_triton_selection.py']))"
  for s in 2048 65536; do for h in 1 6; do
    step "S2_memcheck_topk_s${s}_hpg${h}" 40 "$K" compute-sanitizer --tool memcheck --launch-timeout 0 python3 -c \
        "import sys; from nsa.attention import selection; selection.TOPK_CHOICE = 'topk'; \
from nsa.attention.kernels import qualify; sys.exit(qualify.main(['--dtype', 'bf16', '--seq-len', '$s', '--hpg', '$h', \
'--kernels', 'select,sel_kv']))"
  done; done
fi

if [ "$PART" = h100 ]; then
  H="$W/h100"; mkdir -p "$H"
  RD=artifacts/validate/gk; HD=artifacts/validate/h100
  # the first of: this machine's gpu_kernels run, a committed one of the same source; else the phase is skipped
  MODE=$(python3 - "$RD" "$HD" <<'PY' 2> "$H/reuse_check.txt"
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
  step H1_h100_single 530 "$H" python3 -m validation.cli run runbooks/h100_single.yaml $MODE
  for f in report.md report.html results.json junit.xml; do cp $HD/$f "$H/" 2>/dev/null; done
fi

if [ "$PART" = choices ]; then
  C="$W/choices"; mkdir -p "$C"
  qualify_choices C1 "$C" $CHOICE_NAMES  # numerics, then memcheck, of every choice (K5 ran the winners' only)
  # PART=kernels' K4 on this machine: continued (its files), not again
  if [ -f "$W/kernels/choices_65536b1.json" ]; then choices_ab K4 "$W/kernels"; else choices_ab C3 "$C"; fi
  step C4_range_q_tiles 150 "$C" python3 benchmarks/tune_kernels.py --device cuda --all --families range_q \
      --candidates bn32,bn32_s3,m64_bn32,1 --seq-lens 65536,2048 --batch 1,8 --repeats 5 --warmup 1 --timeout 120 \
      --json "$C/range_q_tiles.json"
fi

if [ "$PART" = trainer ]; then
  T="$W/trainer"
  step T0_loss_tests 90 "$T" python3 -m pytest -q -p no:cacheprovider tests/nsa/test_loss.py
  step T0_loss_memcheck 120 "$T" compute-sanitizer --tool memcheck --launch-timeout 0 python3 -m pytest -q \
      -p no:cacheprovider tests/nsa/test_loss.py -k fused
  step T0_loss 90 "$T" python3 benchmarks/bench_loss.py --device cuda --repeats 10 \
      --fused-configs 8192x16,16384x32 --json "$T/loss.json"
  OLD="NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=reference"
  step T1_dense_each_change 240 "$T" python3 benchmarks/bench_train.py --device cuda --models dense --modes graphs \
      --repeats 2 --variant "old:$OLD" --variant "rope:NSA_OPT_FUSED=0,NSA_LOSS=reference,NSA_ROPE=fused" \
      --variant "adam:NSA_OPT_FUSED=1,NSA_LOSS=reference,NSA_ROPE=reference" \
      --variant "loss:NSA_OPT_FUSED=0,NSA_LOSS=fused,NSA_ROPE=reference" --json "$T/dense_each_change.json"
  step T2_long_context 120 "$T" python3 benchmarks/bench_train.py --device cuda --modes graphs --contexts 32768,16384 \
      --json "$T/long_context.json"
  step T3_compile 200 "$T" python3 benchmarks/bench_train.py --device cuda --modes compile,compile+graphs \
      --json "$T/compile.json"
  step T3_test_compiled_capture 120 "$T" python3 -m pytest -q -p no:cacheprovider \
      tests/nsa/training/test_cuda_graphs.py -k compiled_model
fi
for d in kernels selection h100 choices trainer; do [ "$PART" = "$d" ] && [ -d "$W/$d" ] && pack "$d"; done
log "done"
tail -n 12 "$W"/kernels/*.txt 2>/dev/null | cut -c1-200
tail -n 12 "$W"/selection/*.txt "$W"/choices/*.txt "$W"/trainer/*.txt 2>/dev/null | cut -c1-220
