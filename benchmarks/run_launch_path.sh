#!/usr/bin/env bash
# One device call for the launch-path work: GPU tests (all, or the files
# given), then the routing sweep and the goal table.  Results land in $OUT.
#   CUPY_SWAP_COMMIT=$(git rev-parse --short HEAD) STEPS="tests sweep goals" \
#       bash benchmarks/run_launch_path.sh [pytest args]
set -uo pipefail
STEPS=${STEPS:-tests sweep goals}
source "$(dirname "$0")/device_env.sh"
status=0
echo "${CUPY_SWAP_COMMIT:-unknown}" | tee "$OUT/commit.txt"  # the device's git metadata may be stale
for step in $STEPS; do
    case $step in
    tests)
        nvidia-smi -L | tee "$OUT/pytest.log"
        $PY -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -40 | tee -a "$OUT/pytest.log"
        [[ ${PIPESTATUS[0]} == 0 ]] || status=1 ;;
    sweep)
        $PY benchmarks/route_sweep.py --json "$OUT/route_sweep.json" 2>&1 | tee "$OUT/route_sweep.log" || status=1 ;;
    host)
        $PY benchmarks/lean_goals.py --host-only 2>&1 | tee "$OUT/host_rows.log" || status=1 ;;
    profile)
        $PY benchmarks/profile_hot_path.py 2>&1 | tee "$OUT/profile_hot_path.log" || status=1 ;;
    goals)
        $PY benchmarks/lean_goals.py --json "$OUT/goals.json" 2>&1 | tee "$OUT/goals.log" || status=1 ;;
    esac
done
exit $status
