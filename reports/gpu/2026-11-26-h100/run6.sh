#!/usr/bin/env bash
# Run 6 (2026-11-26, 09:05-09:18 UTC, the project at 4f278c9): three calls on one warm H100, from the repository
# root, outputs under $OUT (copied to run6/). 15 minutes of device time in all; 144 s were left.
# Call 1 (502 s): runbooks/gpu_kernels.yaml whole, cold Triton cache -> run6/gpu_kernels_run/
PART=1 BUDGET=590 bash reports/gpu/next_run.sh
# Call 2 (90 s): the layer with each index build, alternated A B A B, then a profile with the Triton build
# (its files did not come back: call 3 repeats it) -> run6/after/attn_index_*
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1; T0=$(date +%s)
for r in 1 2; do for b in triton torch; do
  NSA_INDEX_BUILD=$b timeout 70 python3 benchmarks/bench_attention.py --device cuda --dtype bf16 --shape m7c \
      --paths nsa-triton --seq-lens 2048,65536 --json $OUT/attn_index_${b}_$r.json > $OUT/attn_index_${b}_$r.txt 2>&1
  RC=$?; echo "[$(( $(date +%s)-T0 ))s] build $b round $r rc $RC" | tee -a $OUT/log.txt
done; done
# Call 3 (93 s): the profile with the Triton build, and one fp32 case with IEEE products under memcheck
# -> run6/after/profile_index_triton.*, memcheck_fp32_ieee.txt
export PATH=$PATH:/usr/local/cuda/bin; mkdir -p /tmp/p
NSA_INDEX_BUILD=triton timeout 60 python3 benchmarks/profile_layer.py --seq-lens 2048,65536 --batch 8,1 \
    --paths nsa-triton --json /tmp/p/profile_index_triton.json > /tmp/p/profile_index_triton.txt 2>&1
timeout 110 compute-sanitizer --tool memcheck --launch-timeout 0 python3 -m nsa.attention.kernels.qualify \
    --dtype fp32 --fp32-dots ieee --seq-len 65536 --hpg 6 > /tmp/p/memcheck_fp32_ieee.txt 2>&1
tar czf $OUT/p.tgz -C /tmp p
# (At 4f278c9 the index build was chosen by the environment variable NSA_INDEX_BUILD, read by triton_selected;
# since then it is NSAConfig.index_build: `--index-build triton|torch` on bench_attention.py and profile_layer.py.)
