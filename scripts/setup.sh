#!/usr/bin/env bash
# Install everything gpucr needs on a fresh Debian/Ubuntu machine and build it.
#
#   scripts/setup.sh            system packages, CRIU 4.2.1 (+ crit), release build
#
# Environment: CRIU_TARBALL=PATH (a local criu_4.2.1.orig.tar.xz, see install-criu.sh),
# SKIP_CRIT=1. Idempotent: a second run only rebuilds what changed.
set -euo pipefail
trap 'printf "setup: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/.."

log() { printf 'setup: %s\n' "$*" >&2; }

[ "$(id -u)" = 0 ] || { log "error: run as root (apt-get, CRIU install, checkpointing need it)"; exit 1; }

# Every package named: installs run with --no-install-recommends. procps: pgrep (tests).
# linux-libc-dev and libdrm-dev: the kernel and libdrm headers the uAPI check compiles against.
# podman and runc: the container tests (tests/containers.rs) checkpoint containers with them.
# python3-pip: the CUDA header tests fetch cuda.h from NVIDIA's runtime wheels (scripts/fetch-cuda-headers.sh).
# iproute2: CRIU dumps a tree's own network namespace with `ip`, and the tests give a tree
# one (its loopback brought up with `ip`).
# postgresql, nginx and python3: the real programs tests/real_programs.rs dumps and restores
# (docs/real-programs.md); the tests use Debian's binaries (/usr/lib/postgresql/15/bin,
# /usr/sbin/nginx, /usr/bin/python3) and util-linux's setpriv and nsenter.
packages=(build-essential pkg-config ca-certificates util-linux procps nftables linux-libc-dev libdrm-dev
          podman runc iproute2 postgresql nginx python3 python3-pip)
missing=()
for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

command -v cargo >/dev/null || { log "error: cargo not found: install Rust (https://rustup.rs)"; exit 1; }

scripts/install-criu.sh

log "building gpucr (release)"
cargo build --release --workspace --lib --bins --examples -q
log "ready: target/release/gpucr"
