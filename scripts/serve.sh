#!/bin/sh
# The dashboard as `make run` starts it, for the Docker image and any service manager: the
# users file with a first admin on the first start (its one-time password in a 0600 file
# beside it, never printed; changed at the first sign-in), the embedded
# Ray in its single-machine mode (its servers on 127.0.0.1), then Streamlit with
# .streamlit/config.toml (no usage statistics, 512 MB request bodies, no Deploy button).
# ADDRESS and PORT as in the Makefile; serving beyond this machine needs TLS in front.
set -eu
cd "$(dirname "$0")/.."
# Every file the service writes is its user's alone (the data folder, Ray's session files
# and logs under its own 0700 temp folder, reports).
umask 077
PYTHON="${PYTHON:-python}"
"$PYTHON" -m auditlib users init
if [ -z "${AUDIT_RAY_ADDRESS:-}" ]; then
    export RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0
fi
export RAY_USAGE_STATS_ENABLED=0
# In a process group of its own, ended with it (scripts/in_own_group.sh: SIGTERM reaches
# the server, and nothing it started outlives a kill -9).
exec sh scripts/in_own_group.sh "$PYTHON" -m streamlit run app.py \
    --server.address "${ADDRESS:-127.0.0.1}" --server.port "${PORT:-8501}"
