#!/usr/bin/env bash
# Issue 41 (host pools) on the device, in one call: the machine's facts, the
# host-pool GPU tests (figures as JSON lines), then `bench --pin`.  Every log
# goes under $OUT.  Usage: bash benchmarks/device_issue41.sh [COMMIT]
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source benchmarks/device_env.sh
echo "${1:-unknown}" >"$OUT/commit.txt"
{
    date -u
    id
    echo "ulimit -l: $(ulimit -l)"
    echo "numa online: $(cat /sys/devices/system/node/online 2>/dev/null)"
    echo "THP: $(cat /sys/kernel/mm/transparent_hugepage/enabled 2>/dev/null) defrag: $(cat /sys/kernel/mm/transparent_hugepage/defrag 2>/dev/null)"
    grep -E 'MemTotal|MemAvailable|Hugepagesize' /proc/meminfo
    nvidia-smi --query-gpu=name,pci.bus_id,driver_version,memory.total --format=csv
    nvidia-smi topo -m 2>/dev/null | head -5
} >"$OUT/machine.txt" 2>&1
timeout 20 $PY -m cupy_swap info >"$OUT/info.txt" 2>&1
export CUPY_SWAP_HOSTPOOL_LOG=$OUT/hostpool_gpu.jsonl
timeout 140 $PY -m pytest -q -p no:cacheprovider -rs tests/test_hostpool_gpu.py >"$OUT/pytest_hostpool_gpu.log" 2>&1
echo "pytest rc=$?" >>"$OUT/pytest_hostpool_gpu.log"
timeout 120 $PY -m cupy_swap bench --pin --gib 16 --chunk-gib 2,16 --stall-gib 32 --stall-chunk-gib 2 \
    --json "$OUT/pin_bench.json" >"$OUT/pin_bench.log" 2>&1
echo "bench rc=$?" >>"$OUT/pin_bench.log"
tail -n 5 "$OUT/pytest_hostpool_gpu.log"; cat "$OUT/pin_bench.log"
cat "$OUT/hostpool_gpu.jsonl" 2>/dev/null | cut -c1-600
