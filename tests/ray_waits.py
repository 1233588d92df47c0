"""How long a test waits for a Ray worker to start a run it was handed.

A cold worker (the first of a Ray instance, or one after a run's worker was stopped by
force) imports torch and auditlib before its run's start message: about 2.6 s of one core
on an idle 2-core AMD EPYC (about 1.2 s more while scipy.stats, scikit-learn and SQLAlchemy
came with them, and 2-3 s more while torch._dynamo's import came first too). In the suite,
two pytest workers, their Ray instances, Streamlit servers and browsers share those 2 cores:
22 s was seen here, and over 60 s in CI (stop 83, Ray's workers then at nice 15; see
conftest.py). A test of cancellation, outages or shutdown is not a test of how fast a
worker starts, so it waits this long for the start and keeps its own bounds for what it
tests.
"""

from __future__ import annotations

WORKER_START_S = 240.0
