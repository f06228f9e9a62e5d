#!/usr/bin/env bash
# Issue 38 on the GPU, in two device calls of at most 10 minutes (carry .probes:
# host_floor.py copied from ../shared/probes):
#   PART=1 bash benchmarks/device_issue38.sh   # the suite, soak rounds 1-2, host time beside the floor
#   PART=2 bash benchmarks/device_issue38.sh   # soak round 3, memcheck, bench --peers
#   PART=3 bash benchmarks/device_issue38.sh   # the three gate tests that failed under load, looped (GATE_S=120 s)
#                                              # in 4 processes, slot graphs off then on (about 5 min)
# At most 8 files come back: soak logs are summarised into soak_*_tails.txt.
set -u
source "$(dirname "$0")/device_env.sh"
PART=${PART:-1}
soak() {  # soak <rounds> <memcheck files or none> <name>
    rm -rf /tmp/soak
    OUT=/tmp/soak PROCS=4 ROUNDS=$1 MEMCHECK=$2 timeout "$3" bash "$(dirname "$0")/soak.sh" > "$OUT/soak_$4.txt" 2>&1
    echo "soak rc=$?"; cat "$OUT/soak_$4.txt"
    for f in /tmp/soak/soak_r*_p*.log; do
        echo "== $f"; grep -E "^(FAILED|ERROR)|^E  |passed|failed" "$f" | tail -24
        grep -A60 "^Timeout (" "$f" | grep -E "^Timeout|^Thread|^Current thread|File .*(cupy_swap|tests)/" | head -60
    done > "$OUT/soak_$4_tails.txt"
    [[ -f /tmp/soak/memcheck.log ]] && tail -40 /tmp/soak/memcheck.log > "$OUT/memcheck.log"
}
if [[ $PART == 1 ]]; then
    # 1. The GPU suite.
    timeout 240 $PY -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 -rfE tests \
        --ignore=tests/test_remote.py --ignore=tests/test_remote_issue39.py --ignore=tests/test_remote_peers.py \
        > "$OUT/suite.log" 2>&1
    echo "suite rc=$?"; tail -1 "$OUT/suite.log"; grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
    # 2. Soak rounds 1 and 2 (about 135 s each).
    soak 2 none 300 r12
    # 3. Host time beside the floor design.
    if [[ -f .probes/host_floor.py ]]; then
        (cd .probes && CUPY_SWAP_SRC=.. BLOCKS=4096,32768 ITERS=60 timeout 100 $PY host_floor.py) > "$OUT/host_floor.log" 2>&1
        tail -30 "$OUT/host_floor.log"
    fi
elif [[ $PART == 3 ]]; then
    # 5b. Does a kernel's first load wait for the GPU's queued work (NOTES 74)?
    for mode in LAZY EAGER; do  # LAZY: the default since CUDA 12.2
        CUDA_MODULE_LOADING=$mode timeout 60 $PY benchmarks/probes/lazy_load_probe.py 2>&1 | tail -2
    done | tee "$OUT/lazy_load.txt"
    # 6. The gate tests that failed under load (NOTES 72), each process looping them for
    #    120 s; a failure's message names the call that waited (CallTimes).
    G="tests/test_trust_gpu.py::test_a_late_check_never_rewrites_another_swaps_verdict
       tests/test_trust_gpu.py::test_a_slot_swap_never_waits_for_another_streams_queued_slot
       tests/test_launch_checks_gpu.py::test_a_busy_stream_and_many_queued_checked_swaps"
    for graphs in 0 1; do
        for p in 1 2 3 4; do
            (end=$((SECONDS + ${GATE_S:-120})); while ((SECONDS < end)); do
                # shellcheck disable=SC2086
                CUPY_SWAP_SLOT_GRAPHS=$graphs timeout 100 $PY -m pytest -q -p no:cacheprovider \
                    -o faulthandler_timeout=40 $G 2>&1 \
                    | grep -E "^E  |passed|failed|^Timeout|^Thread|^Current thread|File .*(cupy_swap|tests)/" | tail -40
            done > "/tmp/gates_g${graphs}_p$p.log" 2>&1) &
        done
        wait
        echo "slot graphs $graphs:"; cat /tmp/gates_g"${graphs}"_p*.log | grep -cE "passed|failed" \
            | xargs echo "  runs:"; cat /tmp/gates_g"${graphs}"_p*.log | grep -E "failed|^E  " | sort | uniq -c | head -20
        grep -h -A30 "^Timeout" /tmp/gates_g"${graphs}"_p*.log | head -60  # the first stuck test's stacks
    done | tee "$OUT/gates.txt"
else
    # 4. Soak round 3 and memcheck.
    soak 1 "tests/test_lifetimes_gpu.py tests/test_slot_path_gpu.py tests/test_torch_gpu.py" 400 r3
    # 5. One part against the peers.
    timeout 100 $PY -m cupy_swap bench --peers --block-bytes 4K,32K --json "$OUT/peers.json" > "$OUT/peers.log" 2>&1
    tail -16 "$OUT/peers.log"
fi
