# Issue 55 on a lent GPU: its CUDA tests, then IG eager, compiled (a CUDA graph) and
# breaching's on torchvision's ResNet-18 at 224 px (benchmarks.compiled_step), FedLeak's,
# GradInversion's and GRNN's eager and compiled there, and --attack all one attack after
# another and at once (benchmarks.attacks_at_once).
# Here first: python -m benchmarks.device.pack, and in .whl/ the wheels of what that machine
# lacks (its Python is 3.12): sqlalchemy, greenlet, bcrypt (binary: the device tool's README's
# pip download with --python-version 3.12 and its manylinux platforms, plus
# manylinux_2_24_x86_64), phe, opacus and breaching's needs:
#   .venv/bin/python -m pip download -d .whl --no-deps breaching==0.1.2 hydra-core==1.3.8 \
#       omegaconf==2.3.0 antlr4-python3-runtime==4.9.3 phe==1.5.0 opacus==1.6.0
# and for the text step our pins of what its image has older (transformers 5.17 there):
#   transformers==5.24.0 peft==0.21.2, and tokenizers==0.23.3 (binary, as bcrypt)
# (hydra-core 1.3 needs omegaconf below 2.4; antlr4's is a source archive: `pip wheel --no-deps
# -w .whl` it, then remove the archive).
# Then the device tool:
# command "bash benchmarks/device/issue55.sh [STEP...]", carry [".gpu", ".whl"].
# STEPs (default "tests"; timeout_s 560), each in a call of its own within a session's 15
# minutes: tests (the 20 CUDA tests of the compiled step, the loop, attacks at once and steps
# without host reads: 229 s on an H200, 2026-11-30; and since then the 5 of the captured step
# and the 4 of the L-BFGS attacks' captured evaluation),
# captests (only the CUDA tests of the captured step, the L-BFGS attacks' captured evaluation
# and attacks at once: no compiling, about a minute; the compiled step's passed on an H200 on
# 2026-11-30),
# captured (IG eager, captured=true and breaching, 3 seeds at 300 steps, and 8 starts
# captured: the eager step recorded as a CUDA graph after 2 eager steps, no compiling;
# attacks.captured; its CUDA tests are in the tests step: run tests first),
# capbudget (one captured run of the paper's 24,000 steps),
# tf32 (the captured step's rows again with TF32 on for both sides, 3 seeds: what the faster
# arithmetic gives and whether the PSNR moves; the product keeps TF32 off, and every other
# step runs in its full float32),
# nhwc (the captured step's row of one start, each beside the same with our model's weights
# channels-last, NHWC, and breaching's, 3 seeds: whether cuDNN's NHWC convolutions speed the
# step and keep the PSNR; the product keeps NCHW),
# dlgcap (DLG eager, captured=true and breaching's deepleakage, 30 L-BFGS steps of 20
# evaluations, seed 0, and 8 starts captured: what the L-BFGS attacks' recorded evaluation,
# lbfgs.RecordedRows, gives at 224 px; dlgcap:N for N steps),
# atonce (only the CUDA test of attacks at once against one after another, under CUDA's
# deterministic kernels and with its control: the one that failed on 2026-11-30; if it
# passes, at once can become the default on CUDA: engine.at_once.UNCONFIRMED_ON_CUDA),
# ig (3 seeds x eager, compiled and breaching at 300 steps, and 8 starts compiled once: about
# 7 minutes on an H200, from 2026-11-30's rows: each compiled run traces its own step, 44 s
# with Inductor's cache warm and 107 s on a fresh machine, the 8 starts' 84 s),
# keep (IG eager and compiled, 3 seeds, 300 steps, its traces kept from run to run on CUDA,
# each run's reserved memory printed: what keeping saves there and what it holds),
# budget (one compiled run of the paper's 24,000 steps),
# fedleak (FedLeak eager and compiled at 200 steps, seed 0, and 4 starts compiled once; two
# graphs per count of starts, so about twice IG's compiling: run it in a call of its own),
# gi (GradInversion the same way, its 4 starts without noise; one graph per count),
# grnn (GRNN the same way),
# all (--attack all at 224 px through run_audit, its plan of 3060 steps one attack after
# another and at once, once each, with a time budget of 120 s: the steps each way makes in
# it, or its seconds where the plan finishes first: benchmarks.attacks_at_once; at most
# about 5 minutes: run it in a call of its own), all:S (a budget of S seconds),
# allcap (the same with every attack that can record its step as a CUDA graph:
# attacks.captured.BY_DEFAULT_ON_CUDA; allcap:S as all:S),
# text (the text audit on CUDA: tests/test_text_device.py, each text attack there against the
# CPU on the tiny models, then benchmarks.text_device on GPT-2 small at 16 x 32, DAGER's run
# and TAG's, LAMP's and TIGER's seconds a step; about 2 minutes), textcpu (the same benchmark
# on that machine's 16 CPU cores, beside it),
# ig:N, fedleak:N, gi:N and grnn:N (N steps instead of 300, 200, 200 and 200),
# essentials (captests captured:200 allcap:60 capbudget nhwc:200 tf32:200 dlgcap, one call,
# as far as its deadline lets: timeout_s 500). Every run prints a JSON line, kept in $OUT.
# The call's deadline: ISSUE55_SECONDS (470 s by default, under the issue's 8 minutes a call)
# from its start; the device tool's limit, 600 s, allows ISSUE55_SECONDS=585.
# One call's deadline (the device tool's timeout_s less a margin): each step gets at most
# what is left of it, and one with under 30 s left is skipped, so a call of several steps
# ends with what it measured rather than being killed with nothing written. A step cut short
# keeps its log in $OUT (benchmarks.compiled_step --from-log makes its file from it).
END=$((SECONDS + ${ISSUE55_SECONDS:-470}))  # from the call's start, the wheels' install included
STARTED=$(mktemp)  # what this call writes is newer: the check reads nothing committed before
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p .peers && ln -sfn /tmp/site .peers/site  # benchmarks.peers imports breaching there
export PYTHONPATH=$PWD:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi -L
R=benchmarks/device/run.py
bench="python3 $R benchmarks.compiled_step --device cuda --case resnet18-224"
t() { local left=$((END - SECONDS - 5)); echo $(( $1 < left ? $1 : left )); }
steps=${*:-tests}
# essentials: every item of the issue's "What must be shown" in one call, in the order of
# what they decide (the captured step's tests and rates, the plan of every attack, bounded
# by its 60 s, then the paper's budget, which takes what is left), then what is tried beside
# them, as far as the deadline lets.
steps=${steps/essentials/captests captured:200 allcap:60 capbudget nhwc:200 tf32:200 dlgcap}
for step in $steps; do
  s=${step%%:*}; n=${step#*:}; [ "$n" = "$step" ] && n=""
  if [ $((END - SECONDS)) -lt 30 ]; then echo "skipped $step: under 30 s of this call left" | tee -a "$OUT/skipped.log"; continue; fi
  echo "== $step at ${SECONDS} s" | tee -a "$OUT/steps.log"
  case $s in
    tests) timeout $(t 300) python3 $R pytest -q -p no:cacheprovider -rs tests/test_compiled_step.py tests/test_captured_step.py tests/test_captured_lbfgs.py tests/test_loop.py tests/test_attacks_at_once.py tests/test_host_reads.py tests/test_unknown_rows.py tests/test_attack_gradinversion.py -k cuda 2>&1 | tail -25 | tee "$OUT/tests.log" ;;
    captests) timeout $(t 300) python3 $R pytest -q -p no:cacheprovider -rs tests/test_captured_step.py tests/test_captured_lbfgs.py tests/test_attacks_at_once.py -k cuda 2>&1 | tail -25 | tee "$OUT/captests.log" ;;
    captured) timeout $(t 540) $bench --kinds eager,captured --steps "${n:-300}" --seeds 3 --starts 8 2>&1 | tee "$OUT/captured.log" | tail -8 ;;
    nhwc) timeout $(t 540) $bench --kinds captured --channels-last --steps "${n:-300}" --seeds 3 --starts 1 2>&1 | tee "$OUT/nhwc.log" | tail -6 ;;
    dlgcap) timeout $(t 540) $bench --attack dlg --kinds eager,captured --steps "${n:-30}" --seeds 1 --starts 8 2>&1 | tee "$OUT/dlgcap.log" | tail -6 ;;
    tf32) timeout $(t 540) $bench --kinds captured --tf32 --steps "${n:-300}" --seeds 3 --starts 1 2>&1 | tee "$OUT/tf32.log" | tail -6 ;;
    capbudget) timeout $(t 500) $bench --no-peer --kinds captured --paper-budget --budget-only 2>&1 | tee "$OUT/capbudget.log" | tail -4 ;;
    atonce) timeout $(t 240) python3 $R pytest -q -p no:cacheprovider -rs tests/test_attacks_at_once.py -k "cuda and stream" 2>&1 | tail -25 | tee "$OUT/atonce.log" ;;
    ig) timeout $(t 540) $bench --steps "${n:-300}" --seeds 3 --starts 8 2>&1 | tee "$OUT/ig.log" | tail -12 ;;
    fedleak) timeout $(t 540) $bench --attack fedleak --no-peer --steps "${n:-200}" --seeds 1 --starts 4 2>&1 | tee "$OUT/fedleak.log" | tail -6 ;;
    gi) timeout $(t 540) $bench --attack gi --no-peer --steps "${n:-200}" --seeds 1 --starts 4 2>&1 | tee "$OUT/gi.log" | tail -6 ;;
    grnn) timeout $(t 540) $bench --attack grnn --no-peer --steps "${n:-200}" --seeds 1 --starts 4 2>&1 | tee "$OUT/grnn.log" | tail -6 ;;
    keep) timeout $(t 540) $bench --no-peer --keep-traces --steps 300 --seeds 3 --starts 1 2>&1 | tee "$OUT/keep.log" | tail -4 ;;
    budget) timeout $(t 500) $bench --no-peer --paper-budget --budget-only 2>&1 | tee "$OUT/budget.log" | tail -6 ;;
    all) timeout $(t 540) python3 $R benchmarks.attacks_at_once --device cuda --case resnet18-224 --rounds 1 --seconds "${n:-120}" 2>&1 | tee "$OUT/all.log" | tail -4 ;;
    allcap) timeout $(t 540) python3 $R benchmarks.attacks_at_once --device cuda --case resnet18-224 --rounds 1 --seconds "${n:-120}" --captured 2>&1 | tee "$OUT/allcap.log" | tail -4 ;;
    text) timeout $(t 300) python3 $R pytest -q -p no:cacheprovider -rs tests/test_text_device.py 2>&1 | tail -25 | tee "$OUT/text-tests.log"
      timeout $(t 300) python3 $R benchmarks.text_device --device cuda --model "${n:-gpt2}" 2>&1 | tee "$OUT/text.log" | tail -6 ;;
    textcpu) timeout $(t 400) python3 $R benchmarks.text_device --device cpu --model "${n:-gpt2}" 2>&1 | tee "$OUT/textcpu.log" | tail -6 ;;
    *) echo "unknown step $s" ;;
  esac
done
# Only the files this call wrote: a committed file of an earlier call is not this call's figure.
find benchmarks/results -maxdepth 1 -newer "$STARTED" \( -name 'compiled_step-*cuda-*.json' -o -name 'attacks_at_once-cuda-*.json' -o -name 'text_device-*.json' \) -exec cp {} "$OUT/" \;
# The issue's items read from what this call wrote (benchmarks/device/issue55_check.py).
python3 -m benchmarks.device.issue55_check "$OUT" | tee "$OUT/check.log"
