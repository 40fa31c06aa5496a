#!/bin/sh
# The CPU counts the GPU campaign's estimates scale by (results/gpu_campaign/estimate.py), under the code of the two
# H200 slices (OLD: a worktree at commit c5e23f5 with this checkout's benchmarks/bench_campaign_host.py copied into
# it) and under this checkout's (NEW), each on one thread:
#   results/gpu_campaign/timings/measure.sh OLD_CHECKOUT
# writes host-old.md, plain-old.md and host-new.md beside this file.
set -e
old=$1
new=$(cd "$(dirname "$0")/../../.." && pwd)
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-python}
(cd "$old" && PYTHONPATH=$old OMP_NUM_THREADS=1 $py benchmarks/bench_campaign_host.py --n 200) > "$here/host-old.md"
(cd "$old" && PYTHONPATH=$old OMP_NUM_THREADS=1 $py benchmarks/bench_campaign_host.py --plain) > "$here/plain-old.md"
(cd "$new" && PYTHONPATH=$new OMP_NUM_THREADS=1 $py benchmarks/bench_campaign_host.py --n 200) > "$here/host-new.md"
