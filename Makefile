# `make run` and `make test` each do the whole set-up first: a .venv with the pinned
# requirements (installed once; redone only when requirements.txt changes) and the system
# packages the product needs where this user can install them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.requirements-installed
EDITABLE := $(VENV)/.auditlib-installed
PORT ?= 8501
# Only this machine by default; ADDRESS=0.0.0.0 serves the network (sign-in is on; put TLS first).
ADDRESS ?= 127.0.0.1

export RAY_USAGE_STATS_ENABLED := 0
# The embedded Ray (no AUDIT_RAY_ADDRESS) in Ray's single-machine mode: its servers bind to
# 127.0.0.1 instead of every interface (read by Ray at import, so set for the process).
EMBEDDED_RAY_LOCAL := $(if $(AUDIT_RAY_ADDRESS),,RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0)

.PHONY: setup system-deps run test test-fast lint format bench reproduce verdicts walk

setup: $(STAMP) $(EDITABLE) system-deps

$(STAMP): requirements.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --disable-pip-version-check -q -r requirements.txt
	cp requirements.txt $(STAMP)

# auditlib itself, editable, so `python -m auditlib` works from any folder with the venv
# active (docs/FLOWER.md); built with the venv's setuptools (no download where it is there).
$(EDITABLE): pyproject.toml $(STAMP)
	$(BIN)/pip install --disable-pip-version-check -q "setuptools>=64"
	$(BIN)/pip install --disable-pip-version-check -q --no-deps --no-build-isolation -e .
	touch $(EDITABLE)

system-deps:
	@bash scripts/install_system_deps.sh

# The first start creates the users file with an admin and writes its one-time password to a
# 0600 file beside it (never printed); the rest of the server's settings are
# .streamlit/config.toml's, every file it writes its user's alone (scripts/serve.sh does the same);
# the server runs in a process group of its own, ended with it (scripts/in_own_group.sh).
run: setup
	$(BIN)/python -m auditlib users init
	umask 077 && $(EMBEDDED_RAY_LOCAL) sh scripts/in_own_group.sh $(BIN)/streamlit run app.py --server.port $(PORT) --server.address $(ADDRESS)

# Two pytest-xdist workers by default (TEST_WORKERS=0: one process), each taking whole test
# files (--dist loadfile): a module's shared server, browser or federation starts once. On 2
# cores the suite waits on servers, browsers and subprocesses for much of its time; two
# workers fill it (Intel Xeon, 2026-12-02: 21.3 min in one process and 12.0 with two; later,
# as the machine slowed, 27.3 and 18.1). Handing out the longest files first was not faster.
TEST_WORKERS ?= 2
XDIST = $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile)

test: setup
	$(BIN)/python -m pytest $(XDIST)

# The inner loop: everything but the real browser, Ray and the tests over 10 s
# (markers set in tests/conftest.py); `make test` still runs them all.
test-fast: setup
	$(BIN)/python -m pytest $(XDIST) -m "not browser and not ray and not slow"

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	PYTHONPATH=. $(BIN)/lint-imports

format: setup
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: setup
	$(BIN)/python benchmarks/attack_throughput.py

reproduce: setup
	$(BIN)/python benchmarks/reproduce_foundation.py

# The audit preset against the paper's at one budget, and the verdict beside the guesses
# (about 70 min on 2 cores; docs/REPRODUCTION.md, "Verdicts").
verdicts: setup
	$(BIN)/python -m benchmarks.verdicts

# The README walkthrough and the Compare / Trade-off defaults in a real browser, screenshots
# and PDF pages in tests/artifacts/walk_* (about 40 min on 2 cores).
walk: setup
	$(BIN)/python -m benchmarks.browser_walk
