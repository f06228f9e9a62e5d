#!/usr/bin/env bash
# One device call for the ownership and routing fixes: the whole suite
# (hatchling from ./.whl for the packaging tests), then the reproductions'
# figures (benchmarks/lifetime_repros.py).  Results land in $OUT.
set -uo pipefail
source "$(dirname "$0")/device_env.sh"
status=0
nvidia-smi -L | tee "$OUT/pytest.log"
$PY -m pytest -q -p no:cacheprovider "$@" 2>&1 | tail -40 | tee -a "$OUT/pytest.log"
[[ ${PIPESTATUS[0]} == 0 ]] || status=1
$PY benchmarks/lifetime_repros.py --json "$OUT/lifetime_repros.json" 2>&1 | tee "$OUT/lifetime_repros.log" || status=1
exit $status
