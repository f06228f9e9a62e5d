set -u
export PYTHONPATH=$PWD:$PWD/.whl_site PIP_NO_INDEX=1 PYTHONUNBUFFERED=1
timeout 200 python3 -m pytest -q -x -p no:cacheprovider tests/test_inline_gpu.py tests/test_threads_gpu.py tests/test_prepared_gpu.py tests/test_swap_gpu.py > $OUT/pytest_quick.log 2>&1
tail -3 $OUT/pytest_quick.log
python3 -m cupy_swap bench --peers --host-time --json $OUT/peers.json > $OUT/peers.log 2>&1
tail -110 $OUT/peers.log
