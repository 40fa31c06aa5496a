#!/bin/sh
# The CPU measurements the GPU campaign's estimates scale from (results/gpu_campaign/estimate.py): the training step
# and the evaluation's host time of each run's shape, under the code of the two H200 slices (OLD, commit c5e23f5:
# the loop before the fast forward and the batches made ahead) and under this checkout's (NEW), in alternation,
# each on one thread. Usage: results/gpu_campaign/timings/measure.sh OLD_CHECKOUT  (a worktree at c5e23f5 with
# this checkout's benchmarks/bench_campaign_*.py copied into it). Writes steps-{old,new}-{1,2}.md and
# eval-{old,new}.md beside this file.
set -e
old=$1
new=$(cd "$(dirname "$0")/../../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
for round in 1 2; do
  for side in old new; do
    tree=$old; [ $side = new ] && tree=$new
    (cd "$tree" && PYTHONPATH=$tree OMP_NUM_THREADS=1 $py benchmarks/bench_campaign_steps.py --steps 20 --repeat 3) \
      > "$here/steps-$side-$round.md"
  done
done
for side in old new; do
  tree=$old; [ $side = new ] && tree=$new
  (cd "$tree" && PYTHONPATH=$tree OMP_NUM_THREADS=1 $py benchmarks/bench_campaign_eval.py --n 500 --repeat 2) \
    > "$here/eval-$side.md"
done
