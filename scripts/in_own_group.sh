#!/bin/sh
# Run a server in a process group of its own and end that group with it: whatever ends the
# server (SIGTERM, Ctrl-C, a crash, kill -9), nothing it started outlives it (the embedded
# Ray's servers, agents and workers would otherwise live on under init for a minute after
# a kill -9). SIGTERM, SIGINT and SIGHUP are passed to the server, which ends its runs
# truthfully and stops Ray itself (app.py's lifespan); the group is killed after it exits.
# Used by `make run` and scripts/serve.sh: sh scripts/in_own_group.sh COMMAND [ARGS...]
set -u
# A non-interactive shell starts background jobs in its own group, so setsid does not
# fork: the server's pid is the new group's id.
setsid "$@" &
server=$!
trap 'kill -TERM "$server" 2>/dev/null' TERM INT HUP
# wait returns early when a trapped signal arrives: wait again until the server is gone.
while kill -0 "$server" 2>/dev/null; do
    wait "$server"
    status=$?
done
kill -KILL "-$server" 2>/dev/null
exit "${status:-0}"
