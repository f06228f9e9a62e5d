#!/usr/bin/env bash
# Everything the GPU machine has to run, from the source tree, as named steps:
#   CUPY_SWAP_COMMIT=$(git rev-parse --short HEAD) STEPS="tests gpus" \
#       bash benchmarks/run_device.sh [pytest args for the tests step]
# Steps (default "tests"), in the order given:
#   tests    the README's test command: every test, GPU and two-GPU ones included  (~3 min)
#   peers    bench --peers: the README's performance table and chart               (~2 min)
#   gpus     bench --gpus all, 1250 x 32 KiB and 2 MiB, every driver               (~3 min)
#   bench    the reference table, the wide sweep, duplex, staged sweep, pytest-benchmark,
#            breakdown (benchmarks/make_tables.py turns them into results/RESULTS.md)
#   sweep    the routing sweep (benchmarks/route_sweep.py)
#   host     host time per call (benchmarks/lean_goals.py --host-only, ~40 s)
#   goals    the launch-path goal table (benchmarks/lean_goals.py, ~3 min)
#   profile  where a call's host time goes (benchmarks/profile_hot_path.py)
#   repros   the ownership reproductions (benchmarks/lifetime_repros.py)
# Results land in $OUT (or ./device-out), beside commit.txt: the device's git
# metadata may be stale, so the commit is passed in CUPY_SWAP_COMMIT.
set -uo pipefail
STEPS=${STEPS:-tests}
source "$(dirname "$0")/device_env.sh"
status=0
echo "${CUPY_SWAP_COMMIT:-unknown}" | tee "$OUT/commit.txt"
bench() { $PY -m cupy_swap bench "$@"; }
for step in $STEPS; do
    case $step in
    tests)
        nvidia-smi -L | tee "$OUT/pytest.log"
        $PY -m pytest -q -p no:cacheprovider "$@" >>"$OUT/pytest.log" 2>&1 || status=1
        tail -40 "$OUT/pytest.log" ;;
    peers)
        bench --peers --json "$OUT/peers.json" 2>&1 | tee "$OUT/peers.log" || status=1 ;;
    gpus)
        bench --gpus all --gpu-blocks 1250 --block-bytes 32k,2m --json "$OUT/gpus.json" 2>&1 \
            | tee "$OUT/gpus.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    bench)
        bench --modes kernel,dma,auto --json "$OUT/seed_table.json" 2>&1 | tail -14 || status=1
        bench --sweep wide --no-baseline --reps 20 --json "$OUT/goals.json" >"$OUT/goals.log" 2>&1 || status=1
        bench --bidir --with-gemm --reps 15 --json "$OUT/duplex.json" 2>&1 | tail -14 || status=1
        $PY benchmarks/staged_sweep.py >"$OUT/staged_sweep.txt" 2>&1 || status=1
        $PY -m pytest -q benchmarks/ -p no:cacheprovider -k "test_swap and (32KiBx1250 or 2MiBx1)" \
            --benchmark-json "$OUT/pytest_benchmark.json" 2>&1 | tail -4 || status=1
        $PY benchmarks/breakdown.py >"$OUT/breakdown.txt" 2>&1 || status=1 ;;
    sweep)
        $PY benchmarks/route_sweep.py --json "$OUT/route_sweep.json" 2>&1 | tee "$OUT/route_sweep.log" || status=1 ;;
    host)
        $PY benchmarks/lean_goals.py --host-only 2>&1 | tee "$OUT/host_rows.log" || status=1 ;;
    goals)
        $PY benchmarks/lean_goals.py --json "$OUT/goals.json" 2>&1 | tee "$OUT/goals.log" || status=1 ;;
    profile)
        $PY benchmarks/profile_hot_path.py 2>&1 | tee "$OUT/profile_hot_path.log" || status=1 ;;
    repros)
        $PY benchmarks/lifetime_repros.py --json "$OUT/lifetime_repros.json" 2>&1 \
            | tee "$OUT/lifetime_repros.log" || status=1 ;;
    *)
        echo "run_device.sh: unknown step '$step'" >&2
        status=2 ;;
    esac
done
exit $status
