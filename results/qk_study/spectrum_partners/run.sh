#!/bin/bash
# The partner columns (configs/qk_spectrum_partners_cpu.toml), unit by unit: the untrained model, then each column
# with its three seeds, the columns of the spectrum's best partners first; then the whole command once more, which
# finds every row, trains nothing and writes the outputs. Resumable. Run from the repository root; ASPAN names the
# command (default .venv/bin/aspan), OUT the run directory, CONFIG the settings (../spectrum_partners_cap/run.sh sets
# the cap run's).
set -e
ASPAN=${ASPAN:-.venv/bin/aspan}
OUT=${OUT:-runs/qk_spectrum_partners_cpu}
CONFIG=${CONFIG:-configs/qk_spectrum_partners_cpu.toml}
order=(none)
for column in 88 80 96 104 72 64 112 120 127; do
  order+=("qk-column:$column/replay 0/select" "qk-column:$column/replay 0/seed 1" "qk-column:$column/replay 0/seed 2")
done
for unit in "${order[@]}"; do
  $ASPAN study qk --config "$CONFIG" --out "$OUT" --threads 1 --quiet --unit "$unit"
done
$ASPAN study qk --config "$CONFIG" --out "$OUT" --threads 1 --quiet
