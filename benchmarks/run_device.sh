#!/usr/bin/env bash
# Everything the GPU has to do for a release, from the source tree:
#   bash benchmarks/run_device.sh tests   # the README's test command (every test, GPU ones included)
#   bash benchmarks/run_device.sh bench   # every figure the README and RESULTS.md quote
#   bash benchmarks/run_device.sh peers   # bench --peers and --host-time (issue 10's baseline)
#   bash benchmarks/run_device.sh lean    # issue 10's goal table (benchmarks/lean_goals.py, ~3 min)
#   bash benchmarks/run_device.sh all     # tests, bench and peers, packed into results.tgz
#                                         # (~7 min of work: with a machine start it may not fit one
#                                         # 10-minute device call; run `tests`, then `bench` and `peers`)
# Results land in $OUT (or ./device-out); `all` packs them into one
# results.tgz (the device tool brings back at most eight files) beside the
# logs.  benchmarks/make_tables.py turns them into benchmarks/results/RESULTS.md
# and the README's tables.
set -uo pipefail
what=${1:-all}
OUT=${OUT:-device-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
status=0
if [[ $what == tests || $what == all ]]; then
    nvidia-smi -L | tee "$OUT/pytest.log"
    python3 -m pytest -q -p no:cacheprovider 2>&1 | tail -60 | tee -a "$OUT/pytest.log"
    [[ ${PIPESTATUS[0]} == 0 ]] || status=1
fi
if [[ $what == peers || $what == all ]]; then
    python3 -m cupy_swap bench --peers --host-time --json "$OUT/peers.json" >"$OUT/peers.log" 2>&1 || status=1
    tail -130 "$OUT/peers.log"
fi
if [[ $what == lean ]]; then
    python3 benchmarks/lean_goals.py --json "$OUT/lean_goals.json" ${COMMIT:+--commit "$COMMIT"} \
        >"$OUT/lean_goals.log" 2>&1 || status=1
    tail -30 "$OUT/lean_goals.log"
fi
if [[ $what == bench || $what == all ]]; then
    python3 -m cupy_swap bench --modes kernel,dma,auto --json "$OUT/seed_table.json" 2>&1 | tail -14 || status=1
    python3 -m cupy_swap bench --sweep goals --no-baseline --reps 20 --json "$OUT/goals.json" >"$OUT/goals.log" 2>&1 || status=1
    tail -34 "$OUT/goals.log"
    python3 -m cupy_swap bench --bidir --with-gemm --reps 15 --json "$OUT/duplex.json" 2>&1 | tail -14 || status=1
    python3 benchmarks/staged_sweep.py >"$OUT/staged_sweep.txt" 2>&1 || status=1
    tail -22 "$OUT/staged_sweep.txt"
    python3 -m pytest -q benchmarks/ -p no:cacheprovider -k "test_swap and (32KiBx1250 or 2MiBx1)" \
        --benchmark-json "$OUT/pytest_benchmark.json" 2>&1 | tail -4 || status=1
    python3 benchmarks/breakdown.py >"$OUT/breakdown.txt" 2>&1 || status=1
    cat "$OUT/breakdown.txt"
fi
if [[ $what == all ]]; then
    (cd "$OUT" && tar czf results.tgz --exclude results.tgz . && find . -type f ! -name results.tgz \
        ! -name pytest.log ! -name peers.log ! -name goals.log -delete)
fi
exit $status
