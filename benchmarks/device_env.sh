#!/usr/bin/env bash
# Sourced by the device scripts: the Python to use, $OUT, and the wheels
# carried in ./.whl (hatchling and its needs, for the packaging tests)
# installed offline on the PYTHONPATH.
OUT=${OUT:-device-out}
PY=${PY:-/opt/torch/.venv/bin/python3}
mkdir -p "$OUT"
if ls .whl*/*.whl >/dev/null 2>&1; then  # .whl (build tools), .whl-nixl (NIXL): carried separately
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl*/*.whl
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export UCX_NET_DEVICES=${UCX_NET_DEVICES:-lo}  # NIXL over loopback only
