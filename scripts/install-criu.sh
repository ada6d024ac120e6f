#!/usr/bin/env bash
# Install CRIU >= 4.2 (and crit, which the tests use) where gpucr finds them.
#
# Why 4.2: CRIU 4.1 cannot dump any TCP/UDP socket on Linux >= 6.16 (getsockopt
# SO_PASSCRED/SO_PASSSEC fail on inet sockets there; CRIU issue #2705). 4.2.1 dumps and
# restores a listening server on such kernels.
#
# Usage: scripts/install-criu.sh
#   CRIU_TARBALL=PATH   use this criu_4.2.1.orig.tar.xz instead of downloading it
#                       (its sha256 is checked either way)
#   PREFIX=DIR          install into DIR/bin (default /usr/local)
#   CRIU_BUILD_DIR=DIR  where to unpack and build (default /var/cache/gpucr)
#   SKIP_CRIT=1         do not install crit
#   CRIT_VENV=DIR       the virtual environment crit lives in (default /opt/gpucr/crit);
#                       $PREFIX/bin/crit links to it
#
# Idempotent: when `criu` >= 4.2 (and crit, unless SKIP_CRIT=1) are already installed it
# returns at once. Needs root for apt-get and for installing into PREFIX.
set -euo pipefail
trap 'printf "install-criu: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR

CRIU_VERSION=4.2.1
CRIU_SHA256=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
PREFIX=${PREFIX:-/usr/local}
CRIU_BUILD_DIR=${CRIU_BUILD_DIR:-/var/cache/gpucr}
SKIP_CRIT=${SKIP_CRIT:-0}
CRIT_VENV=${CRIT_VENV:-/opt/gpucr/crit}
# Every package the build and crit need, named: installs run with --no-install-recommends,
# so nothing may come in as a recommendation (libprotobuf-dev, which CRIU's images/Makefile
# finds descriptor.proto through, is only recommended by protobuf-compiler).
BUILD_DEPS=(build-essential pkg-config xz-utils ca-certificates
    libprotobuf-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler
    libnl-3-dev libnet1-dev libcap-dev libbsd-dev libgnutls28-dev libnftables-dev
    uuid-dev libdrm-dev nftables)
# crit: Debian's own python3 in a virtual environment that sees Debian's protobuf,
# setuptools and wheel (PEP 668: a stock Debian refuses pip installs into the system).
CRIT_DEPS=(python3 python3-venv python3-protobuf python3-setuptools python3-wheel)

log() { printf 'install-criu: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# criu_version_ok BINARY: true when BINARY reports version >= 4.2.
criu_version_ok() {
    local v major minor
    v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9.]*\).*/\1/p' | head -n1)
    [ -n "$v" ] || return 1
    major=${v%%.*}
    minor=$(echo "$v" | cut -d. -f2)
    [ "$major" -gt 4 ] || { [ "$major" -eq 4 ] && [ "${minor:-0}" -ge 2 ]; }
}

crit_ok() {
    [ "$SKIP_CRIT" = 1 ] && return 0
    command -v crit >/dev/null 2>&1 && crit --help >/dev/null 2>&1
}

criu_bin=$(command -v criu || true)
if [ -n "$criu_bin" ] && criu_version_ok "$criu_bin" && crit_ok; then
    log "criu $("$criu_bin" --version | sed -n 's/^Version: *//p') at $criu_bin is recent enough; nothing to do"
    exit 0
fi

[ "$(id -u)" = 0 ] || die "run as root (apt-get and installing into $PREFIX need it)"

wanted=("${BUILD_DEPS[@]}")
[ "$SKIP_CRIT" = 1 ] || wanted+=("${CRIT_DEPS[@]}")
missing=()
for p in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
    log "installing build dependencies: ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

mkdir -p "$CRIU_BUILD_DIR"
tarball="$CRIU_BUILD_DIR/criu_${CRIU_VERSION}.orig.tar.xz"
if [ -n "${CRIU_TARBALL:-}" ]; then
    [ -f "$CRIU_TARBALL" ] || die "CRIU_TARBALL=$CRIU_TARBALL does not exist"
    cp -f "$CRIU_TARBALL" "$tarball"
elif [ ! -f "$tarball" ]; then
    # Debian unstable's source package; only the orig tarball is needed.
    log "downloading criu ${CRIU_VERSION} source from Debian unstable"
    src_list=/etc/apt/sources.list.d/gpucr-unstable-src.list
    echo "deb-src http://deb.debian.org/debian unstable main" > "$src_list"
    apt-get update -qq -o Dir::Etc::sourcelist="$src_list" -o Dir::Etc::sourceparts=- \
        -o APT::Get::List-Cleanup=0
    (cd "$CRIU_BUILD_DIR" && apt-get source --download-only -qq "criu=${CRIU_VERSION}-1" \
        || apt-get source --download-only -qq criu) || true
    rm -f "$src_list"
    [ -f "$tarball" ] || die "could not download criu_${CRIU_VERSION}.orig.tar.xz; pass CRIU_TARBALL=PATH"
fi
echo "$CRIU_SHA256  $tarball" | sha256sum -c --quiet - \
    || die "$tarball: sha256 mismatch (expected $CRIU_SHA256)"

src="$CRIU_BUILD_DIR/criu-${CRIU_VERSION}"
if [ ! -x "$src/criu/criu" ]; then
    log "building criu ${CRIU_VERSION} in $src"
    rm -rf "$src"
    tar -C "$CRIU_BUILD_DIR" -xf "$tarball"
    make -C "$src" -j"$(nproc)" criu >"$CRIU_BUILD_DIR/criu-build.log" 2>&1 \
        || { tail -n 30 "$CRIU_BUILD_DIR/criu-build.log" >&2; die "criu build failed (log: $CRIU_BUILD_DIR/criu-build.log)"; }
fi
install -D -m 0755 "$src/criu/criu" "$PREFIX/bin/criu"
log "installed $PREFIX/bin/criu ($("$PREFIX/bin/criu" --version | sed -n 's/^Version: *//p'))"

if [ "$SKIP_CRIT" != 1 ] && ! crit_ok; then
    log "installing crit into $CRIT_VENV"
    make -C "$src" crit >>"$CRIU_BUILD_DIR/criu-build.log" 2>&1 \
        || { tail -n 30 "$CRIU_BUILD_DIR/criu-build.log" >&2; die "crit build failed"; }
    rm -rf "$CRIT_VENV"
    /usr/bin/python3 -m venv --system-site-packages "$CRIT_VENV" \
        || die "python3 -m venv $CRIT_VENV failed"
    (cd "$src" && "$CRIT_VENV/bin/python" -m pip install -q --no-index --no-build-isolation \
        --no-deps ./lib ./crit) >>"$CRIU_BUILD_DIR/criu-build.log" 2>&1 \
        || { tail -n 30 "$CRIU_BUILD_DIR/criu-build.log" >&2; die "crit install into $CRIT_VENV failed"; }
    ln -sfn "$CRIT_VENV/bin/crit" "$PREFIX/bin/crit"
    hash -r
    crit_ok || die "crit was installed but does not run"
    log "installed crit at $(command -v crit)"
fi
