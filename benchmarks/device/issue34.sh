# Issue 34 on a lent GPU (about 9 minutes there): the CUDA tests of the together paths, then
# the CUDA rows of docs/PERFORMANCE.md. Here first: python -m benchmarks.device.pack, and
# wheels of what that machine lacks in .whl/ (sqlalchemy, phe, opacus, bcrypt; see the device
# tool's README). Then the device tool: command "bash benchmarks/device/issue34.sh",
# carry [".gpu", ".whl"], timeout_s 560. What each step measured is in $OUT even where a
# later one is cut off; --from-log makes the rows of a cut-off run.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L
save() { cp benchmarks/results/updates_together-cuda.json benchmarks/results/lbfgs_together-cuda.json docs/PERFORMANCE.md "$OUT"/ 2>/dev/null; }
R=benchmarks/device/run.py
timeout 90 python3 $R pytest -q -p no:cacheprovider tests/test_lbfgs_batched.py tests/test_updates_together.py tests/test_loop.py -k cuda 2>&1 | tail -25 | tee "$OUT/tests.log"
timeout 200 python3 $R benchmarks.updates_together --device cuda --attacks dlg --repeats 1 --apart-updates 2 2>&1 | tee "$OUT/dlg.log" | tail -12; save
timeout 100 python3 $R benchmarks.updates_together --device cuda --attacks ig --repeats 2 2>&1 | tee "$OUT/ig.log" | tail -12; save
timeout 120 python3 $R benchmarks.lbfgs_together --device cuda --threads 1 --repeats 1 2>&1 | tee "$OUT/lbfgs.log" | tail -12; save
