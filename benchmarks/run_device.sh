#!/usr/bin/env bash
# Everything the GPU has to do for a release, in one call: the GPU tests, the
# seed's table (kernel, dma and auto side by side), the goal sweep, full
# duplex and interference, the staged-path sweep, and the pytest-benchmark
# suite on its main cases.
# Results land in $OUT (or ./device-out); benchmarks/make_tables.py turns the
# JSON into benchmarks/results/RESULTS.md.
set -uo pipefail
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
status=0
python3 -m pytest -q -m gpu tests/ -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/pytest.log" || status=1
python3 -m cupy_swap bench --modes kernel,dma,auto --json "$OUT/seed_table.json" 2>&1 | tail -12 || status=1
python3 -m cupy_swap bench --sweep goals --no-baseline --reps 20 --json "$OUT/goals.json" > "$OUT/goals.log" 2>&1 || status=1
tail -40 "$OUT/goals.log"
python3 -m cupy_swap bench --bidir --with-gemm --reps 15 --json "$OUT/duplex.json" 2>&1 | tail -14 || status=1
python3 benchmarks/staged_sweep.py > "$OUT/staged_sweep.txt" 2>&1 || status=1
tail -21 "$OUT/staged_sweep.txt"
python3 -m pytest -q benchmarks/ -p no:cacheprovider -k "32KiBx1250 or 2MiBx1" \
    --benchmark-json "$OUT/pytest_benchmark.json" 2>&1 | tail -4 || status=1
python3 benchmarks/breakdown.py > "$OUT/breakdown.txt" 2>&1 || status=1
exit $status
