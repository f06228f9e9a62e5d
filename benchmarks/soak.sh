#!/usr/bin/env bash
# The soak (issue 38): the GPU tests in PROCS processes at once, ROUNDS times,
# then compute-sanitizer memcheck over the tests that free, reuse or capture
# what a queued launch reads (lifetimes, slots, torch tensors, captures).
# Looks for a launch failure that shows only under load; exits nonzero on any
# failed test or sanitizer error.  Logs go to $OUT (or ./device-out).
#   bash benchmarks/soak.sh            # PROCS=4 ROUNDS=3 FILES="<the default set>"
#   MEMCHECK=none bash benchmarks/soak.sh   # the rounds only (a call too short for both)
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
PROCS=${PROCS:-4}
ROUNDS=${ROUNDS:-3}
FILES=${FILES:-"tests/test_slot_path_gpu.py tests/test_row_slots_gpu.py tests/test_lifetimes_gpu.py
    tests/test_torch_gpu.py tests/test_threads_gpu.py tests/test_launch_checks_gpu.py tests/test_trust_gpu.py
    tests/test_gpu_mapping_gpu.py tests/test_dtypes_gpu.py tests/test_exactly_once_gpu.py"}
MEMCHECK=${MEMCHECK:-"tests/test_lifetimes_gpu.py tests/test_slot_path_gpu.py tests/test_torch_gpu.py"}
status=0
for round in $(seq "$ROUNDS"); do
    pids=()
    for p in $(seq "$PROCS"); do
        # shellcheck disable=SC2086
        # A test stuck past STUCK_S dumps every thread's stack into its log (pytest's faulthandler):
        # where a call waited, and on what (NOTES 72).
        $PY -m pytest -q -p no:cacheprovider -p no:randomly -o faulthandler_timeout="${STUCK_S:-40}" $FILES \
            >"$OUT/soak_r${round}_p${p}.log" 2>&1 &
        pids+=($!)
    done
    for i in "${!pids[@]}"; do
        if ! wait "${pids[$i]}"; then
            status=1
            echo "soak round $round process $((i + 1)): FAILED"
        fi
        tail -1 "$OUT/soak_r${round}_p$((i + 1)).log"
    done
done
grep -h "cudaErrorLaunchFailure\|illegal memory access" "$OUT"/soak_*.log && status=1
if [[ $MEMCHECK == none ]]; then
    echo "soak: memcheck skipped (MEMCHECK=none)"
elif command -v compute-sanitizer >/dev/null || [[ -x /usr/local/cuda/bin/compute-sanitizer ]]; then
    san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
    # shellcheck disable=SC2086
    # The staging test that runs out of GPU memory on purpose is left out: memcheck reports the
    # refused cudaMalloc as an API error (NOTES 75).  CUPY_SWAP_SANITIZER=1: the tests skip
    # only their reference-counting assertions (frames outlive the call there).
    CUPY_SWAP_SANITIZER=1 $san --tool memcheck --error-exitcode 9 --target-processes all \
        $PY -m pytest -q -p no:cacheprovider $MEMCHECK -k "${MEMCHECK_K:-not many and not does_not_fit}" \
        >"$OUT/memcheck.log" 2>&1 || status=1
    tail -3 "$OUT/memcheck.log"
else
    echo "soak: compute-sanitizer not found; memcheck skipped" | tee "$OUT/memcheck.log"
fi
exit $status
