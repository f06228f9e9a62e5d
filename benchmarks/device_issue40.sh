#!/usr/bin/env bash
# Issue 40 (and issue 38's two soak failures and duplex), everything one
# device call needs (at most about 8 minutes):  bash benchmarks/device_issue40.sh
set -u
source "$(dirname "$0")/device_env.sh"
# 1. The two tests that failed under load with slot graphs on (NOTES 68), looped
#    in four processes with graphs off (the default) while step 2 runs.
T="tests/test_trust_gpu.py::test_a_late_check_never_rewrites_another_swaps_verdict
   tests/test_launch_checks_gpu.py::test_a_busy_stream_and_many_queued_checked_swaps"
for p in 1 2 3 4; do
    # shellcheck disable=SC2086
    (for i in 1 2 3 4 5; do timeout 60 $PY -m pytest -q -p no:cacheprovider $T 2>&1 | tail -1; done \
        > "/tmp/load_p$p.log") &
done
# 2. The captured swap's GPU tests and the example.
timeout 240 $PY -m pytest -q -p no:cacheprovider -n 4 --dist loadfile --durations=10 -rfE \
    tests/test_captured_gpu.py tests/test_captured_layouts_gpu.py \
    tests/test_examples_gpu.py::test_inside_cuda_graph \
    > "$OUT/captured_tests.log" 2>&1
echo "captured tests rc=$?"; tail -1 "$OUT/captured_tests.log"; grep -E "^(FAILED|ERROR)" "$OUT/captured_tests.log" | head -20
wait
cat /tmp/load_p*.log | sort | uniq -c | tee "$OUT/load.txt"
# 3. A replay's device time against the eager op with GPU rows.
CUPY_SWAP_BENCH_HOST_BYTES=100e9 timeout 100 $PY -m cupy_swap bench --captured --reps 30 \
    --json "$OUT/captured.json" > "$OUT/captured.log" 2>&1
echo "bench rc=$?"; tail -20 "$OUT/captured.log"
# 4. Issue 38: duplex with random, host-run and contiguous blocks (32 KiB).
timeout 90 $PY -m cupy_swap bench --bidir > "$OUT/bidir.log" 2>&1
echo "bidir rc=$?"; tail -12 "$OUT/bidir.log"
# 5. Issue 38: which step of a slot-graph build waits for a busy GPU (about 10 s).
timeout 40 $PY benchmarks/probes/graph_build_stall.py > "$OUT/graph_build_stall.log" 2>&1
echo "stall probe rc=$?"; cat "$OUT/graph_build_stall.log"
