#!/bin/sh
# The one command a lent GPU session runs (`make gpu-loan`): install the carried wheels, time the training loop
# against plain PyTorch on the GPU (benchmarks/bench_training.py, bf16, the captured step beside it), then one slice
# of the GPU campaign (`aspan gpu slice`: device checks, then the plan's runs until the budget is spent). Everything
# it writes goes under $OUT (at most 8 files come back from a lent machine): bench_training.md, slice/run.json and
# slice/state.tar.gz (or its parts). docs/howto/gpu.md, "A GPU loan", gives the whole sequence.
#
#   OUT=...      where the files go (the device tool sets it; default runs/gpu-loan)
#   GPU_BUDGET   the slice's wall seconds (default 330: a loan runs two such commands; 560 for one long slice)
#   GPU_BENCH    1 (default): the benchmark first; 0: skip it (the loan's second command)
#   GPU_ARGS     more `aspan gpu slice` options (e.g. --no-checks in the loan's second command)
#   GPU_CAMPAIGN the campaign directory (default results/gpu_campaign/state); GPU_PY the Python (default python3)
#
# The wheels (.gpu-wheels, `make gpu-wheels`) are installed into .gpu-site, which git ignores, so a second command
# of the same loan, run within about 30 s of the first, finds them without carrying them again.
set -u
out=${OUT:-runs/gpu-loan}
budget=${GPU_BUDGET:-330}
py=${GPU_PY:-python3}
site=$PWD/.gpu-site
mkdir -p "$out"
if [ -d .gpu-wheels ] && ls .gpu-wheels/*.whl >/dev/null 2>&1; then
  $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    .gpu-wheels/*.whl || { echo "gpu_loan: installing .gpu-wheels failed" >&2; exit 3; }
fi
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
if ! $py -c "import transformer_lens" 2>/dev/null; then
  echo "gpu_loan: transformer_lens is missing: carry .gpu-wheels (make gpu-wheels) in this command" >&2
  exit 3
fi
if [ "${GPU_BENCH:-1}" = 1 ]; then
  timeout 150 $py benchmarks/bench_training.py --device cuda --amp --capture --rounds 4 \
    > "$out/bench_training.md" 2>&1 || echo "bench_training exited $?" >> "$out/bench_training.md"
fi
$py -m aspan.cli gpu slice --campaign "${GPU_CAMPAIGN:-results/gpu_campaign/state}" --out "$out/slice" \
  --budget "$budget" ${GPU_ARGS:-}
