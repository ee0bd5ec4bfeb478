#!/usr/bin/env bash
# The first GPU run of 2026-11-26 (under 9.5 minutes in all): what produced the files beside this script.
#
#     bash reports/gpu/2026-11-26/run.sh      # in the repository root on a GPU machine; outputs under $OUT (or /tmp)
#
# Phase 1 (about 4 minutes, in parallel, the GPU shared):
#   - every GPU test file in its own process (the kernel tests natively with their full `slow` grids, test_cuda,
#     the op count, the CUDA-graph capture), and the fused selection's tests (NSA_TEST_FUSED_SELECTION=1) apart;
#   - compute-sanitizer memcheck of `python -m nsa.attention.kernels.qualify`, the runbook's default grid
#     (tiled and fused x bf16/fp16/fp32 x S 1,024/2,048/65,536 x hpg 1/6), four cases at a time, highest value first;
#   - the fused top-k selection natively at the lengths that faulted on 2026-11-25 (bf16, fp16; B 1 and 8).
# Phase 2 (the GPU alone): bench_attention (NSA Triton vs dense, m7c, bf16), bench_train (the 125M model and its
# dense twin, eager and CUDA graphs, then --compile if time is left), profile_layer (kernel launches, host and GPU
# time per layer forward+backward, tiled and fused selection).
# Every part has its own time limit, so the script ends (and packs its outputs) inside its time limit.
set -u
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
W=/tmp/w; rm -rf $W; mkdir -p $W/tests $W/memcheck $W/fault $W/bench
T0=$(date +%s)
el() { echo $(( $(date +%s) - T0 )); }
log() { echo "[$(el)s] $*" | tee -a "$OUT/log.txt"; }
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)

{ nvidia-smi; python3 -c "import torch, triton, sys; print('python', sys.version.split()[0]); print('torch', torch.__version__, 'cuda', torch.version.cuda); print('triton', triton.__version__); print(torch.cuda.get_device_name(), torch.cuda.get_device_capability())"; "$SAN" --version; git rev-parse HEAD; git status --short | head -20; } > $W/env.txt 2>&1
log "env: $(grep -m1 -o 'Driver Version: [0-9.]*' $W/env.txt); $(grep -E '^(torch|triton) ' $W/env.txt | tr '\n' ' '); sanitizer $SAN"
(pip install -q --no-deps --no-build-isolation -e . > $W/install.log 2>&1 &)

# ---------------------------------------------------------------------------------------------------- phase 1
run_test() {  # file [name] [env...]: one test file in its own process
  local f=$1 name=${2:-$(basename $1 .py)}; shift 2 2>/dev/null || shift
  ( env "$@" timeout -s KILL 195 python3 -m pytest -v -p no:cacheprovider -rfE --tb=short "$f" \
      --junitxml $W/tests/$name.xml > $W/tests/$name.log 2>&1; echo "exit $?" >> $W/tests/$name.log ) &
}
for f in tests/nsa/attention/kernels/test_triton_range.py tests/nsa/attention/kernels/test_triton_selected.py \
         tests/nsa/attention/kernels/test_triton_selection.py tests/nsa/attention/kernels/test_triton_layer.py \
         tests/nsa/attention/kernels/test_triton_glue.py tests/nsa/attention/kernels/test_reference_kernels.py \
         tests/nsa/attention/kernels/test_aot_compile.py tests/nsa/attention/test_cuda.py \
         tests/nsa/attention/test_op_count.py tests/nsa/training/test_cuda_graphs.py; do
  run_test $f
done
run_test tests/nsa/attention/kernels/test_triton_selection.py test_triton_selection_FUSED NSA_TEST_FUSED_SELECTION=1

# the fused selection natively where it faulted (each case its own process; a fault ends only that one)
( for dt in bf16 fp16; do for s in 1024 1536 2048 2560 3072 4096 6144 8192 16384 32768 65536; do
    echo "$dt $s 1"; done; done; echo "bf16 2048 8"; echo "bf16 8192 8" ) | \
  timeout -s KILL 190 xargs -P 3 -L 1 bash -c 'timeout 90 python3 -m nsa.attention.kernels.qualify --method fused \
    --kernels select --dtype $0 --seq-len $1 --batch $2 > '$W'/fault/$0_S$1_B$2.log 2>&1; \
    echo "$0 S=$1 B=$2 exit $?" >> '$W'/fault/summary.txt' &

# memcheck, the default grid, the cases that faulted first
( for m in tiled fused; do for dt in bf16; do for s in 2048 65536; do for h in 6 1; do echo "$m $dt $s $h"; done; done; done; done
  for m in tiled fused; do for dt in fp16 fp32; do for s in 2048 65536; do for h in 6 1; do echo "$m $dt $s $h"; done; done; done; done
  for m in tiled fused; do for dt in bf16 fp16 fp32; do for h in 6 1; do echo "$m $dt 1024 $h"; done; done; done ) | \
  timeout -s KILL 195 xargs -P 4 -L 1 bash -c 'k=all; [ $0 = fused ] && k=select,sel_kv,sel_query; \
    timeout 150 '"$SAN"' --tool memcheck --target-processes application-only --print-limit 20 \
    python3 -m nsa.attention.kernels.qualify --method $0 --kernels $k --dtype $1 --seq-len $2 --hpg $3 \
    > '$W'/memcheck/$0_$1_S$2_hpg$3.log 2>&1; echo "$0 $1 S=$2 hpg=$3 exit $? $(grep -h "ERROR SUMMARY" '$W'/memcheck/$0_$1_S$2_hpg$3.log)" \
    >> '$W'/memcheck/summary.txt' &

while [ -n "$(jobs -r)" ] && [ $(el) -lt ${DEADLINE1:-200} ]; do sleep 3; done
log "phase 1 done or cut at $(el)s; running: $(jobs -r | wc -l)"
pkill -9 -f "nsa.attention.kernels.qualify" ; pkill -9 -f "pytest -v -p no:cacheprovider"; sleep 1
python3 - <<EOF >> "$OUT/log.txt" 2>&1
import glob, os, xml.etree.ElementTree as ET
for x in sorted(glob.glob("$W/tests/*.log")):
    name = os.path.basename(x)[:-4]
    xml = "$W/tests/" + name + ".xml"
    tail = open(x).read().strip().splitlines()[-2:]
    if os.path.exists(xml):
        r = ET.parse(xml).getroot(); s = r if r.tag == "testsuite" else r[0]
        print(f"TEST {name}: tests {s.get('tests')} failures {s.get('failures')} errors {s.get('errors')} "
              f"skipped {s.get('skipped')} time {s.get('time')}  | {' / '.join(tail)}")
    else:
        print(f"TEST {name}: no junit | {' / '.join(tail)}")
EOF
{ echo "--- fault (fused, native)"; sort $W/fault/summary.txt 2>/dev/null; echo "--- memcheck"; cat $W/memcheck/summary.txt 2>/dev/null; } >> "$OUT/log.txt"
tar czf "$OUT/phase1.tgz" -C $W tests fault memcheck env.txt 2>/dev/null
log "phase 1 packed"

# ---------------------------------------------------------------------------------------------------- phase 2
timeout 75 python3 benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c --paths nsa-triton,dense \
  --seq-lens 2048,16384,65536 --repeats 5 --warmup 2 --json $W/bench/attn.json > $W/bench/attn.txt 2>&1
log "bench_attention exit $?"; cat $W/bench/attn.txt >> "$OUT/log.txt"
timeout 165 python3 benchmarks/bench_train.py --device cuda --modes eager,graphs --timeout 60 --json $W/bench/train.json \
  > $W/bench/train.txt 2>&1
log "bench_train eager,graphs exit $?"; cat $W/bench/train.txt >> "$OUT/log.txt"
timeout 40 python3 benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1 --passes 3 --warmup 2 \
  --json $W/bench/profile.json > $W/bench/profile.txt 2>&1
log "profile (default selection) exit $?"; cat $W/bench/profile.txt >> "$OUT/log.txt"
timeout 25 python3 benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1 --paths nsa-triton --select fused \
  --passes 3 --warmup 2 --json $W/bench/profile_fused.json > $W/bench/profile_fused.txt 2>&1
log "profile (fused selection) exit $?"; cat $W/bench/profile_fused.txt >> "$OUT/log.txt"
tar czf "$OUT/phase2.tgz" -C $W bench 2>/dev/null
left=$(( 525 - $(el) ))
if [ $left -gt 60 ]; then
  timeout $left python3 benchmarks/bench_train.py --device cuda --modes compile --json $W/bench/train_compile.json \
    > $W/bench/train_compile.txt 2>&1
  log "bench_train compile exit $?"; cat $W/bench/train_compile.txt >> "$OUT/log.txt"
  tar czf "$OUT/phase2.tgz" -C $W bench 2>/dev/null
fi
log "done"
