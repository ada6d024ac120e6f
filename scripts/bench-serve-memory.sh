# shellcheck shell=bash
# Sourced by the benchmarks that restore examples/serve_memory.rs (bench-ready.sh,
# bench-migrate.sh): its client and the end of each round's server.

# The client (scripts/serve-memory-client.py): HOST:PORT SECONDS REQUEST...
# shellcheck disable=SC2034 # used by the scripts that source this one
serve_memory_client=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/serve-memory-client.py

# SIGKILL the process whose pid each existing file holds, wait (at most 10 s) until it is
# gone, and remove the file.
kill_pidfiles() {
    local f pid
    for f in "$@"; do
        [ -f "$f" ] || continue
        pid=$(cat "$f")
        kill -KILL "$pid" 2>/dev/null || true
        for _ in $(seq 400); do [ -d "/proc/$pid" ] || break; sleep 0.025; done
        rm -f "$f"
    done
}
