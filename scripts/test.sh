#!/usr/bin/env bash
# Run gpucr's whole test suite (unit, property and end-to-end tests with real CRIU).
# Needs root and CRIU >= 4.2 (`scripts/setup.sh` installs it; this script does too if
# it is missing).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v criu >/dev/null && command -v crit >/dev/null || scripts/install-criu.sh
cargo test --workspace --all-features "$@"
