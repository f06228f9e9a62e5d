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
#   soak     benchmarks/soak.sh (its ROUNDS, PROCS, MEMCHECK; SOAK_S limit, 540 s), logs
#            summarised into soak<k>.txt and soak<k>_tails.txt (a call brings back few files)
#   floor    host time beside benchmarks/probes/host_floor.py (the shared floor probe) (~100 s)
#   lazy     does a kernel's first load wait for the GPU's queued work (LAZY, EAGER; NOTES 74)
#   gates    the gate tests that failed under load (NOTES 72), looped for GATE_S (120) s
#            in 4 processes at once; a stuck test dumps its threads' stacks      (~2.5 min)
#   captured the captured swap's GPU tests and example, then bench --captured     (~5 min)
#   hostpools  the host's facts, the host-pool GPU tests (JSON lines), bench --pin (~5 min)
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
    soak)
        k=$((${k:-0} + 1))  # each soak step of this call summarised into its own files
        rm -rf /tmp/soak
        OUT=/tmp/soak timeout "${SOAK_S:-540}" bash "$(dirname "$0")/soak.sh" >"$OUT/soak$k.txt" 2>&1 || status=1
        cat "$OUT/soak$k.txt"
        for f in /tmp/soak/soak_r*_p*.log; do
            echo "== $f"; grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$f" | tail -24
            grep -A60 "^Timeout (" "$f" | grep -E "^Timeout|^Thread|^Current thread|File .*(cupy_swap|tests)/" | head -60
        done >"$OUT/soak${k}_tails.txt"
        [[ -f /tmp/soak/memcheck.log ]] && tail -40 /tmp/soak/memcheck.log >"$OUT/memcheck$k.log" ;;
    floor)
        (cd benchmarks/probes && CUPY_SWAP_SRC=../.. BLOCKS=4096,32768 ITERS=60 timeout 100 $PY host_floor.py) \
            >"$OUT/host_floor.log" 2>&1 || status=1
        tail -30 "$OUT/host_floor.log" ;;
    lazy)
        for mode in LAZY EAGER; do  # LAZY: the default since CUDA 12.2
            CUDA_MODULE_LOADING=$mode timeout 60 $PY benchmarks/probes/lazy_load_probe.py 2>&1 | tail -2
        done | tee "$OUT/lazy_load.txt" ;;
    gates)
        G="tests/test_trust_gpu.py::test_a_late_check_never_rewrites_another_swaps_verdict
           tests/test_trust_gpu.py::test_a_slot_swap_never_waits_for_another_streams_queued_slot
           tests/test_launch_checks_gpu.py::test_a_busy_stream_and_many_queued_checked_swaps"
        for p in 1 2 3 4; do
            (end=$((SECONDS + ${GATE_S:-120})); while ((SECONDS < end)); do
                # shellcheck disable=SC2086
                timeout 100 $PY -m pytest -q -p no:cacheprovider -o faulthandler_timeout=40 $G 2>&1 \
                    | grep -E "^E  |passed|failed|^Timeout|^Thread|^Current thread|File .*(cupy_swap|tests)/" | tail -40
            done >"/tmp/gates_p$p.log" 2>&1) &
        done
        wait
        {
            cat /tmp/gates_p*.log | grep -cE "passed|failed" | xargs echo "runs:"
            cat /tmp/gates_p*.log | grep -E "failed|^E  " | sort | uniq -c | head -20
            grep -h -A30 "^Timeout" /tmp/gates_p*.log | head -60  # the first stuck test's stacks
        } | tee "$OUT/gates.txt"
        grep -qE "failed|^Timeout" /tmp/gates_p*.log && status=1 ;;
    captured)
        timeout 240 $PY -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --durations=10 -rfE \
            tests/test_captured_gpu.py tests/test_captured_layouts_gpu.py \
            tests/test_examples_gpu.py::test_inside_cuda_graph >"$OUT/captured_tests.log" 2>&1 || status=1
        tail -1 "$OUT/captured_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/captured_tests.log" | head -20
        CUPY_SWAP_BENCH_HOST_BYTES=100e9 timeout 100 $PY -m cupy_swap bench --captured --reps 30 --json "$OUT/captured.json" \
            >"$OUT/captured.log" 2>&1 || status=1
        tail -20 "$OUT/captured.log" ;;
    hostpools)
        {
            date -u
            id
            echo "ulimit -l: $(ulimit -l)"
            echo "numa online: $(cat /sys/devices/system/node/online 2>/dev/null)"
            echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null)" \
                "defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"
            grep -E 'MemTotal|MemAvailable|Hugepagesize' /proc/meminfo
            nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
            nvidia-smi topo -m 2>/dev/null | head -5
        } >"$OUT/machine.txt" 2>&1
        timeout 20 $PY -m cupy_swap info >"$OUT/info.txt" 2>&1
        CUPY_SWAP_HOSTPOOL_LOG=$OUT/hostpool_gpu.jsonl timeout 140 $PY -m pytest -q -p no:cacheprovider -rs \
            tests/test_hostpool_gpu.py >"$OUT/pytest_hostpool_gpu.log" 2>&1 || status=1
        timeout 120 $PY -m cupy_swap bench --pin --gib 16 --chunk-gib 2,16 --stall-gib 32 --stall-chunk-gib 2 \
            --json "$OUT/pin_bench.json" >"$OUT/pin_bench.log" 2>&1 || status=1
        tail -n 5 "$OUT/pytest_hostpool_gpu.log"; cat "$OUT/pin_bench.log"
        cut -c1-600 "$OUT/hostpool_gpu.jsonl" 2>/dev/null ;;
    *)
        echo "run_device.sh: unknown step '$step'" >&2
        status=2 ;;
    esac
done
exit $status
