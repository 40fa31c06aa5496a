#!/bin/bash
# The spectrum's peak (configs/qk_spectrum_peak_cpu.toml), unit by unit: the untrained model, then each pair with its
# three seeds (pair 24, the anchor, first); then the whole command once more, which finds every row, trains nothing
# and writes the outputs. Resumable: a finished unit's rows are kept and it trains nothing when run again. Run from
# the repository root; ASPAN names the command (default .venv/bin/aspan), OUT the run directory.
set -e
ASPAN=${ASPAN:-.venv/bin/aspan}
OUT=${OUT:-runs/qk_spectrum_peak_cpu}
CONFIG=configs/qk_spectrum_peak_cpu.toml
order=(none)
for cond in qk-pair:24 qk-pair:20 qk-pair:22 qk-pair:26 qk-pair:28 qk-pair:16 qk-pair:18; do
  order+=("$cond/replay 0/select" "$cond/replay 0/seed 1" "$cond/replay 0/seed 2")
done
for unit in "${order[@]}"; do
  $ASPAN study qk --config "$CONFIG" --out "$OUT" --threads 1 --quiet --unit "$unit"
done
$ASPAN study qk --config "$CONFIG" --out "$OUT" --threads 1 --quiet
