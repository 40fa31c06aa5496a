#!/bin/bash
# The spectrum's conditions that its exact-accuracy plateau rule stopped at step 300 (no gain of 1 pp over the
# untrained model in the first three evaluations), trained again to the full 2,000-step cap with no stop rule, at the
# learning rate the study chose on its selection set, seed 0: whether the early stop hid a late rise. Slowest first.
# Run from the repository root; ASPAN names the command (default .venv/bin/aspan).
set -e
ASPAN=${ASPAN:-.venv/bin/aspan}
OUT=${OUT:-runs/qk_spectrum_cap}
for cond in qk-pair:63:0.03 qk-pair:48:0.01 qk-column:63:0.003 qk-column:48:0.03 qk-pair:56:0.003 \
            qk-column:32:0.03 qk-pair:8:0.01 qk-column:8:0.003 qk-column:40:0.03 qk-column:56:0.003 \
            qk-pair:0:0.001 qk-column:0:0.001; do
  group=${cond%:*}; lr=${cond##*:}
  [ -f "$OUT/${group/:/}-seed0/run.json" ] && continue  # resumable: a finished run is kept
  $ASPAN train --init results/qk_study/paper_shape/base --task reversal --param length=21-40 \
    --train-only "$group" --lr "$lr" --steps 2000 --batch-size 16 --warmup 15 --weight-decay 0.1 --seed 0 \
    --threads 1 --quiet --eval-every 0 --eval-samples 100 --buckets 1-20,21-40,41-60 --curve-every 100 \
    --curve-buckets 1-20,21-40,41-60 --stop none --out "$OUT/${group/:/}-seed0"
done
