#!/bin/bash
# The partner columns to the cap (configs/qk_spectrum_partners_cap_cpu.toml): the partner columns' runner
# (../spectrum_partners/run.sh, unit by unit, then the whole command once more, which finds every row and writes the
# outputs) with this run's settings. Resumable. Run from the repository root; ASPAN names the command (default
# .venv/bin/aspan), OUT the run directory.
set -e
export CONFIG=configs/qk_spectrum_partners_cap_cpu.toml OUT=${OUT:-runs/qk_spectrum_partners_cap_cpu}
exec bash results/qk_study/spectrum_partners/run.sh
