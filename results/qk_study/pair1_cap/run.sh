#!/bin/bash
# qk-pair:1 (the best single group of the curves study) trained to the full 3,000-step cap, no stop rule
for seed in 0 1 2; do
  .venv/bin/aspan train --init reversal --task reversal --param length=11-20 --train-only qk-pair:1 --lr 0.01 \
    --steps 3000 --batch-size 16 --warmup 15 --weight-decay 0.1 --seed $seed --threads 1 --quiet \
    --eval-every 0 --eval-samples 100 --buckets 1-10,11-20,21-30 --curve-every 100 --curve-buckets 1-10,11-20,21-30 \
    --stop none --out runs/qk_pair1_cap/seed$seed
done
