#!/usr/bin/env bash
# The second GPU run of 2026-11-26: which change to the selection kernels' code or tiling removes the bf16
# miscompute / fault of the importance tile at BM = 64 (hpg 1-3) seen in run.sh's results. Variants (environment
# variables read by an experimental build of nsa/attention/kernels/triton_selection.py; not the committed code):
#   V0 as committed; KT: compressed keys loaded [BC, D] and transposed in the dot (FlashAttention's layout);
#   BM: 128 query rows / 8 warps at every hpg; KTBM: both.
# Each: the selection tests (importance and selection against float64, full grid) in its own process, and memcheck
# of the tiled selection at m7c hpg 1 S 65,536 and at the failing test shape (hpg 2, d_k 32, l 16, d 8, l_sel 64).
# V0 also: memcheck of the fused selection (m7c, hpg 6 and 1) with --launch-timeout 0.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUT=${OUT:-/tmp/gpu_out2}; mkdir -p "$OUT"; W=/tmp/w2; rm -rf $W; mkdir -p $W
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
declare -A ENVS=([V0]="X=0" [KT]="NSA_EXP_KT_ROWS=1" [BM]="NSA_EXP_BM128=1" [KTBM]="NSA_EXP_KT_ROWS=1 NSA_EXP_BM128=1")
mc() {  # name env... -- qualify args
  local name=$1; shift; local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
  ( env "${envs[@]}" timeout 160 "$SAN" --tool memcheck --launch-timeout 0 --target-processes application-only \
      --print-limit 5 python3 -m nsa.attention.kernels.qualify "$@" > $W/mc_$name.log 2>&1
    echo "[$(el)s] memcheck $name exit $? $(grep -h 'ERROR SUMMARY' $W/mc_$name.log | head -1)" >> "$OUT/summary.txt" ) &
}
for v in V0 KT BM KTBM; do
  ( env ${ENVS[$v]} NSA_TEST_FUSED_SELECTION=1 timeout 165 python3 -m pytest -v -p no:cacheprovider --tb=line \
      tests/nsa/attention/kernels/test_triton_selection.py -k "importance_matches or selection_matches or full_grid" \
      --junitxml $W/t_$v.xml > $W/t_$v.log 2>&1
    echo "[$(el)s] tests $v exit $? $(tail -1 $W/t_$v.log)" >> "$OUT/summary.txt" ) &
  mc ${v}_m7c_hpg1_S65536 ${ENVS[$v]} -- --method tiled --kernels select --dtype bf16 --seq-len 65536 --hpg 1
  mc ${v}_hpg2_dk32_S2048 ${ENVS[$v]} -- --method tiled --kernels select --dtype bf16 --seq-len 2048 --hpg 2 \
     --d-k 32 --l 16 --d 8 --l-sel 64 --n-sel 3
done
mc fused_m7c_hpg6_S2048 X=0 -- --method fused --kernels select --dtype bf16 --seq-len 2048 --hpg 6
mc fused_m7c_hpg6_S65536 X=0 -- --method fused --kernels select --dtype bf16 --seq-len 65536 --hpg 6
mc fused_m7c_hpg1_S65536 X=0 -- --method fused --kernels select --dtype bf16 --seq-len 65536 --hpg 1
while [ -n "$(jobs -r)" ] && [ $(el) -lt 175 ]; do sleep 2; done
echo "[$(el)s] end; still running: $(jobs -r | wc -l)" >> "$OUT/summary.txt"
for v in V0 KT BM KTBM; do grep -E "(FAILED|ERROR) +\[|^E  " $W/t_$v.log | head -8 | sed "s/^/$v: /" >> "$OUT/summary.txt"; done
tar czf "$OUT/exp.tgz" -C $W . 2>/dev/null
cat "$OUT/summary.txt"
