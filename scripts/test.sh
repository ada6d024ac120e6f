#!/usr/bin/env bash
# Run gpucr's whole test suite (unit, property and end-to-end tests with real CRIU).
# Needs root and CRIU >= 4.2 (`scripts/setup.sh` installs it; this script does too if
# it is missing).
set -euo pipefail
trap 'printf "test: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."
command -v criu >/dev/null && command -v crit >/dev/null || scripts/install-criu.sh
# The tests that fill a file system mount a tmpfs in their temporary directory and
# unmount it when they end, even when they fail; a test run that was killed cannot.
# Unmount what such runs left, under the tests' lock, so that no live run's is touched.
tmp=${TMPDIR:-/tmp}
flock /tmp/gpucr-tests.lock sh -c '
    findmnt -rn -t tmpfs -o TARGET | grep -E "^$1/\.tmp[^/]+/(roomy|full)\$" |
        while read -r dir; do umount -l "$dir" && echo "test: unmounted $dir, left by a killed test run"; done
' sweep "${tmp%/}" || true
# A test that needs what this machine lacks (podman, root, ...) fails, unless
# GPUCR_TESTS_MAY_SKIP lists it (`GPUCR_TESTS_MAY_SKIP=podman,root`): then the test
# records itself in this ledger as not run, and the ledger is listed at the end.
profile=debug
for arg in "$@"; do [ "$arg" != --release ] || profile=release; done
ledger=${CARGO_TARGET_DIR:-target}/$profile/gpucr-tests-not-run.txt
mkdir -p "$(dirname "$ledger")"
: >"$ledger"
not_run() {
    local n
    n=$(cat "$ledger" 2>/dev/null | wc -l)
    if [ "$n" -gt 0 ]; then
        echo "test: not run: $n test(s) (GPUCR_TESTS_MAY_SKIP=${GPUCR_TESTS_MAY_SKIP:-}):"
        sed 's/^/  /' "$ledger"
    else
        echo "test: not run: none"
    fi
}
trap not_run EXIT
# The end-to-end tests run the gpucr binary with its CRIU plugin (a cdylib, which
# `cargo test` alone does not produce) and the sample workloads.
cargo build --workspace --all-features --lib --bins --examples
# Every test binary runs even after one fails (--no-fail-fast): a failure early in the
# workspace must not hide what the rest would say.
cargo test --workspace --all-features --no-fail-fast "$@"
