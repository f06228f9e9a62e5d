#!/usr/bin/env bash
# Everything the GPU machine has to run, from the source tree, as named steps:
#   CUPY_SWAP_COMMIT=$(git rev-parse --short HEAD) STEPS="tests gpus" \
#       bash benchmarks/run_device.sh [pytest args for the tests step]
# Steps (default "tests"), in the order given:
#   tests    the README's test command: every test, GPU and two-GPU ones included  (~8 min)
#   shards   the same suite in $SHARDS (4) parallel processes, by file (pytest-xdist)  (~3 min)
#   trust    issue 32's probes: a slot swap beside a gated one, what a release blocks
#   peers    bench --peers: the README's performance table and chart               (~2 min)
#   engines  bench --engines: the engine-shaped rows of the README and the results page
#   bidir    bench --bidir: full duplex, random blocks and host runs                 (~30 s)
#   gpus     bench --gpus all, 1250 x 32 KiB and 2 MiB, every driver               (~3 min)
#   bench    the reference table, the wide sweep, duplex, staged sweep, pytest-benchmark
#            (benchmarks/make_tables.py turns them into results/RESULTS.md)
#   sweep    the routing sweep (benchmarks/route_sweep.py)
#   host     host time per call (benchmarks/lean_goals.py --host-only, ~40 s)
#   goals    the launch-path goal table (benchmarks/lean_goals.py, ~3 min)
#   profile  where a call's host time goes (benchmarks/profile_hot_path.py)
#   repros   the ownership reproductions (benchmarks/lifetime_repros.py)
# Results land in $OUT (or ./device-out), beside commit.txt: the device's git
# metadata may be stale, so the commit is passed in CUPY_SWAP_COMMIT.  With
# EXPECT_GPUS=N the tests step fails unless N GPUs answer (the GPU tests skip
# themselves where fewer do, which pytest counts as a pass).  The bench step
# packs its files into bench.tgz (the device tool brings back a few files).
set -uo pipefail
STEPS=${STEPS:-tests}
source "$(dirname "$0")/device_env.sh"
status=0
echo "${CUPY_SWAP_COMMIT:-unknown}" | tee "$OUT/commit.txt"
bench() { $PY -m cupy_swap bench "$@"; }
for step in $STEPS; do
    case $step in
    tests)
        nvidia-smi -L | tee "$OUT/pytest.log" || status=1
        gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
        if [[ $gpus -lt ${EXPECT_GPUS:-0} ]]; then
            echo "run_device.sh: expected $EXPECT_GPUS GPUs, found $gpus" | tee -a "$OUT/pytest.log"
            status=1
        fi
        $PY -m pytest -q -rs -p no:cacheprovider "$@" >>"$OUT/pytest.log" 2>&1 || status=1
        tail -40 "$OUT/pytest.log" ;;
    shards)
        n=${SHARDS:-4}
        run=$((${run:-0} + 1))  # each shards step of this call logs to its own file
        log="$OUT/shards$run.log"
        $PY -m pytest -q -rs -p no:cacheprovider -n "$n" --dist loadfile "$@" >"$log" 2>&1 || status=1
        tail -15 "$log" ;;
    trust)
        $PY benchmarks/probes/trust_probe.py 2>&1 | tee "$OUT/trust_probe.log" || status=1 ;;
    peers)
        bench --peers --json "$OUT/peers.json" 2>&1 | tee "$OUT/peers.log" || status=1 ;;
    engines)
        CUPY_SWAP_BENCH_HOST_BYTES=100e9 bench --engines --json "$OUT/engines.json" 2>&1 \
            | tee "$OUT/engines.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    bidir)
        bench --bidir --reps 15 --json "$OUT/bidir.json" 2>&1 | tee "$OUT/bidir.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    gpus)
        bench --gpus all --gpu-blocks 1250 --block-bytes 32k,2m --reps 15 --json "$OUT/gpus.json" 2>&1 \
            | tee "$OUT/gpus.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    bench)
        b="$OUT/bench"
        mkdir -p "$b"
        bench --modes kernel,dma,auto --json "$b/seed_table.json" >"$b/seed_table.log" 2>&1 || status=1
        bench --sweep wide --no-baseline --reps 20 --json "$b/goals.json" >"$b/goals.log" 2>&1 || status=1
        bench --bidir --with-gemm --reps 15 --json "$b/duplex.json" >"$b/duplex.log" 2>&1 || status=1
        $PY benchmarks/staged_sweep.py >"$b/staged_sweep.txt" 2>&1 || status=1
        $PY -m pytest -q benchmarks/ -p no:cacheprovider -k "test_swap and (32KiBx1250 or 2MiBx1)" \
            --benchmark-json "$b/pytest_benchmark.json" >"$b/pytest_benchmark.log" 2>&1 || status=1
        tail -n 14 "$b/seed_table.log" "$b/duplex.log"
        (cd "$OUT" && tar czf bench.tgz bench && rm -r bench) ;;
    sweep)
        $PY benchmarks/route_sweep.py --json "$OUT/route_sweep.json" 2>&1 | tee "$OUT/route_sweep.log" || status=1 ;;
    host)
        $PY benchmarks/lean_goals.py --host-only 2>&1 | tee "$OUT/host_rows.log" || status=1 ;;
    goals)
        $PY benchmarks/lean_goals.py --json "$OUT/lean_goals.json" 2>&1 | tee "$OUT/lean_goals.log" || status=1 ;;
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
