#!/usr/bin/env bash
# Issue 38, branch slot-verdicts: everything one device call needs to judge it
# (about 8 minutes).  Carry .probes (host_floor.py copied from ../shared/probes).
#   bash benchmarks/device_issue38.sh
set -u
source "$(dirname "$0")/device_env.sh"
git log --oneline -1 > "$OUT/commit.txt" 2>/dev/null
# 1. Does a graph build on the builder thread hold up another thread's calls?
timeout 60 $PY benchmarks/probes/graph_build_thread.py > "$OUT/graph_build_thread.log" 2>&1
echo "probe rc=$?"; cat "$OUT/graph_build_thread.log"
# 2. The GPU suite.
timeout 300 $PY -m pytest -q -p no:cacheprovider -n 8 --dist loadfile --durations=10 tests \
    --ignore=tests/test_remote.py --ignore=tests/test_remote_issue39.py --ignore=tests/test_remote_peers.py \
    > "$OUT/suite.log" 2>&1
echo "suite rc=$?"; grep -E "passed|failed" "$OUT/suite.log" | tail -1; grep -E "^(FAILED|ERROR)" "$OUT/suite.log" | head -20
# 3. Host time beside the floor design.
if [[ -f .probes/host_floor.py ]]; then
    (cd .probes && CUPY_SWAP_SRC=.. BLOCKS=4096,32768 ITERS=60 timeout 100 $PY host_floor.py) > "$OUT/host_floor.log" 2>&1
    grep -o "^[a-z]* *[0-9]* x [0-9]* \|slot+devcheck [0-9.]* GB/s (host [0-9.]* us)\|prepared [0-9.]* GB/s (host [0-9.]* us)" \
        "$OUT/host_floor.log" | paste - - -
fi
# 4. One part against the peers.
timeout 100 $PY -m cupy_swap bench --peers --block-bytes 4K,32K --json "$OUT/peers.json" > "$OUT/peers.log" 2>&1
tail -16 "$OUT/peers.log"
