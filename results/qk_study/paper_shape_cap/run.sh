#!/bin/bash
# The paper-shaped study's full fine-tuning and its best single group (RoPE pair 16) trained to the full 2,000-step
# cap with no stop rule, at the learning rates the study chose on its selection set, seeds 0, 1, 2.
# Run here with --init runs/qk_paper_shape_cpu/base, the files copied to results/qk_study/paper_shape/base.
set -e
for seed in 0 1 2; do
  for cond in all:0.0003 qk-pair:16:0.01; do
    group=${cond%:*}; lr=${cond##*:}
    .venv/bin/aspan train --init results/qk_study/paper_shape/base --task reversal --param length=21-40 \
      --train-only "$group" --lr "$lr" --steps 2000 --batch-size 16 --warmup 15 --weight-decay 0.1 --seed $seed \
      --threads 1 --quiet --eval-every 0 --eval-samples 100 --buckets 1-20,21-40,41-60 --curve-every 100 \
      --curve-buckets 1-20,21-40,41-60 --stop none --out "runs/qk_paper_shape_cap/${group/:/}-seed$seed"
  done
done
