#!/bin/bash
# The paper-shaped study's `qk` condition (all of W_Q and W_K) trained to the full 2,000-step cap with no stop rule,
# at the learning rate the study chose on its selection set (1e-3), seeds 0, 1, 2: the same form as run.sh (full
# fine-tuning and pair 16), so the three conditions compare at equal steps.
set -e
ASPAN=${ASPAN:-.venv/bin/aspan}
for seed in 0 1 2; do
  $ASPAN train --init results/qk_study/paper_shape/base --task reversal --param length=21-40 \
    --train-only qk --lr 0.001 --steps 2000 --batch-size 16 --warmup 15 --weight-decay 0.1 --seed $seed \
    --threads 1 --quiet --eval-every 0 --eval-samples 100 --buckets 1-20,21-40,41-60 --curve-every 100 \
    --curve-buckets 1-20,21-40,41-60 --stop none --out "runs/qk_paper_shape_cap/qk-seed$seed"
done
