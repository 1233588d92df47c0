# Issue 34 on a lent GPU: the CUDA tests of the together paths, then the CUDA rows of
# docs/PERFORMANCE.md. Here first: python -m benchmarks.device.pack, and wheels of what that
# machine lacks in .whl/ (sqlalchemy, greenlet, phe, opacus, bcrypt; see the device tool's
# README). Then the device tool: command "bash benchmarks/device/issue34.sh [STEP...]", carry
# [".gpu", ".whl"]. STEPs (default "tests ig gi", about 8.5 minutes on an H200; timeout_s 560):
# tests (30 s), ig (5 repetitions, both arms whole: about 4 minutes), gi (ResNet-20; the
# one-after-another arm on 1 update: 2 minutes), dlg (the one-after-another arm on 1 update:
# 2 minutes); gi:N and dlg:N run N repetitions (about 1.5 and 2 minutes each, so dlg:5 alone
# fills a call of 560 s). Each run of an arm prints a JSON line, kept in $OUT even where a step
# is cut off; --from-log makes the rows from those lines
# (benchmarks/results/updates_together-cuda-runs.jsonl, where earlier sessions' lines are).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L
R=benchmarks/device/run.py
bench() { python3 $R benchmarks.updates_together --device cuda --no-doc "$@"; }
for step in ${*:-tests ig gi}; do
  s=${step%%:*}; n=${step#*:}; [ "$n" = "$step" ] && n=1  # gi:3 -> gi, 3 repetitions
  case $s in
    tests) timeout 110 python3 $R pytest -q -p no:cacheprovider -rs tests/test_lbfgs_batched.py tests/test_updates_together.py tests/test_loop.py tests/test_exact_batchnorm.py -k cuda 2>&1 | tail -25 | tee "$OUT/tests.log" ;;
    ig) timeout 260 bench --attacks ig --repeats 5 2>&1 | tee "$OUT/ig.log" | tail -12 ;;
    gi) timeout $((150 * n)) bench --attacks gi --repeats $n --apart-updates 1 2>&1 | tee "$OUT/gi.log" | tail -12 ;;
    dlg) timeout $((150 * n)) bench --attacks dlg --repeats $n --apart-updates 1 2>&1 | tee "$OUT/dlg.log" | tail -12 ;;
    *) echo "unknown step $s" ;;
  esac
done
