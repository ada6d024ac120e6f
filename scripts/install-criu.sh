#!/usr/bin/env bash
# Install CRIU >= 4.2 (and crit, which the tests use) where gpucr finds them, or build one
# of the CRIU versions gpucr is tested against side by side.
#
# Why 4.2: CRIU 4.1 cannot dump any TCP/UDP socket on Linux >= 6.16 (getsockopt
# SO_PASSCRED/SO_PASSSEC fail on inet sockets there; CRIU issue #2705). 4.2.1 dumps and
# restores a listening server on such kernels.
#
# Usage: scripts/install-criu.sh
#   Uses the system `criu` when it reports version >= 4.2 (4.2.x, 4.3, 4.3.x, ...);
#   otherwise builds CRIU 4.2.1 (or the pinned tarball CRIU_TARBALL names) into
#   $PREFIX/bin, with crit.
#   CRIU_TARBALL=PATH   build from this local tarball instead of downloading 4.2.1: one of
#                       the pinned tarballs below, recognised by its sha256, which also
#                       says which version is built (4.1.1 is refused here: it is older
#                       than 4.2; build it side by side)
#   PREFIX=DIR          install into DIR/bin (default /usr/local)
#   CRIU_BUILD_DIR=DIR  where to unpack and build (default /var/cache/gpucr)
#   SKIP_CRIT=1         do not install crit
#   CRIT_VENV=DIR       the virtual environment crit lives in (default /opt/gpucr/crit);
#                       $PREFIX/bin/crit links to it
#
# Usage: scripts/install-criu.sh --version VERSION [--prefix DIR]
#   Builds one pinned CRIU version side by side, into DIR/bin/criu (default
#   /opt/gpucr/criu/VERSION/bin/criu), and nothing else: the system criu, /usr/local/bin
#   and crit are left alone. VERSION is 4.1.1, 4.2.1 or dev-2cf8f13 (CRIU's criu-dev
#   branch at commit 2cf8f13, which CRIU 4.3 was cut from; it reports "4.2").
#   4.2.1 is downloaded as above when CRIU_TARBALL is not given; the others need
#   CRIU_TARBALL=PATH (which must be that version's pinned tarball) or the tarball already
#   in CRIU_BUILD_DIR. DIR/.gpucr-criu-source records the sha256 of the tarball built.
#
# Pinned tarballs (sha256 checked whatever their origin):
#   criu_4.1.1.orig.tar.xz   f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
#   criu_4.2.1.orig.tar.xz   29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
#   criu-dev-2cf8f13.tar.xz  6b21b9d66a126cbca7bb9bf51f733c447e8e24ccdfe26bebee079d704776acb1
#
# Idempotent: when `criu` >= 4.2 (and crit, unless SKIP_CRIT=1) are already installed,
# or DIR/bin/criu is already that version, it returns at once. Needs root for apt-get and
# for installing into PREFIX or DIR.
set -euo pipefail
trap 'printf "install-criu: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR

# The pinned versions: name, tarball, sha256, the directory the tarball unpacks into, and
# the version the built binary reports (`criu --version`).
VERSIONS=(4.1.1 4.2.1 dev-2cf8f13)
declare -A TARBALL=(
    [4.1.1]=criu_4.1.1.orig.tar.xz
    [4.2.1]=criu_4.2.1.orig.tar.xz
    [dev-2cf8f13]=criu-dev-2cf8f13.tar.xz
)
declare -A SHA256=(
    [4.1.1]=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
    [4.2.1]=29ec0ee09e296479fe7048c80980e8ef1d0684d0b0204c2b101dfea19f6725b9
    [dev-2cf8f13]=6b21b9d66a126cbca7bb9bf51f733c447e8e24ccdfe26bebee079d704776acb1
)
declare -A SRCDIR=(
    [4.1.1]=criu-4.1.1
    [4.2.1]=criu-4.2.1
    [dev-2cf8f13]=criu-dev-2cf8f13
)
declare -A REPORTS=(
    [4.1.1]=4.1.1
    [4.2.1]=4.2.1
    [dev-2cf8f13]=4.2
)

CRIU_VERSION=4.2.1
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

side_version=""
side_prefix=""
while [ "$#" -gt 0 ]; do
    case $1 in
        --version)
            [ "$#" -ge 2 ] || die "--version needs one of: ${VERSIONS[*]}"
            side_version=$2; shift 2 ;;
        --version=*) side_version=${1#--version=}; shift ;;
        --prefix)
            [ "$#" -ge 2 ] || die "--prefix needs a directory"
            side_prefix=$2; shift 2 ;;
        --prefix=*) side_prefix=${1#--prefix=}; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) die "unknown argument $1 (see --help)" ;;
    esac
done
if [ -n "$side_prefix" ] && [ -z "$side_version" ]; then
    die "--prefix goes with --version (PREFIX=DIR sets where the default install goes)"
fi
if [ -n "$side_version" ] && [ -z "${TARBALL[$side_version]:-}" ]; then
    die "unknown CRIU version '$side_version' (known: ${VERSIONS[*]})"
fi

# reported_version BINARY: the version BINARY reports ("4.2.1", "4.2", "4.3"), or nothing.
reported_version() {
    "$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9]*\(\.[0-9][0-9]*\)*\).*/\1/p' | head -n1
}

# version_at_least VERSION MAJOR MINOR: true when VERSION ("4.3", "4.3.1") >= MAJOR.MINOR.
version_at_least() {
    local major minor
    major=$(echo "$1" | cut -d. -f1)
    minor=$(echo "$1" | cut -s -d. -f2)
    [ -n "$major" ] || return 1
    [ "$major" -gt "$2" ] || { [ "$major" -eq "$2" ] && [ "${minor:-0}" -ge "$3" ]; }
}

# criu_version_ok BINARY: true when BINARY reports version >= 4.2 (4.2, 4.2.1, 4.3, 4.3.x).
criu_version_ok() {
    local v
    v=$(reported_version "$1")
    [ -n "$v" ] && version_at_least "$v" 4 2
}

crit_ok() {
    [ "$SKIP_CRIT" = 1 ] && return 0
    command -v crit >/dev/null 2>&1 && crit --help >/dev/null 2>&1
}

# pinned_version FILE: the pinned version whose tarball FILE is (by its sha256), or nothing.
pinned_version() {
    local sum v
    sum=$(sha256sum "$1" | cut -d' ' -f1)
    for v in "${VERSIONS[@]}"; do
        [ "${SHA256[$v]}" = "$sum" ] && { echo "$v"; return 0; }
    done
    return 0
}

# The version to build, and for a CRIU_TARBALL, which pinned tarball it is.
tarball_version=""
if [ -n "${CRIU_TARBALL:-}" ]; then
    [ -f "$CRIU_TARBALL" ] || die "CRIU_TARBALL=$CRIU_TARBALL does not exist"
    tarball_version=$(pinned_version "$CRIU_TARBALL")
    if [ -z "$tarball_version" ]; then
        pinned=()
        for v in "${VERSIONS[@]}"; do pinned+=("${TARBALL[$v]} (sha256 ${SHA256[$v]})"); done
        die "CRIU_TARBALL=$CRIU_TARBALL is none of the pinned tarballs: $(IFS=,; echo "${pinned[*]}" | sed 's/,/, /g')"
    fi
fi

if [ -n "$side_version" ]; then
    CRIU_VERSION=$side_version
    if [ -n "$tarball_version" ] && [ "$tarball_version" != "$side_version" ]; then
        die "CRIU_TARBALL=$CRIU_TARBALL is the tarball of $tarball_version, not of $side_version"
    fi
    dest=${side_prefix:-/opt/gpucr/criu/$side_version}
    stamp=$dest/.gpucr-criu-source
    if [ -x "$dest/bin/criu" ] && [ "$(reported_version "$dest/bin/criu")" = "${REPORTS[$side_version]}" ]; then
        # A build recorded as another tarball's is rebuilt; one without the record (built
        # by hand from the same source) is taken at its word.
        if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" = "${SHA256[$side_version]}" ]; then
            log "criu $side_version is already built at $dest/bin/criu; nothing to do"
            exit 0
        fi
        log "$dest/bin/criu was built from another tarball (sha256 $(cat "$stamp")); rebuilding it"
    elif [ -e "$dest/bin/criu" ]; then
        log "$dest/bin/criu reports version '$(reported_version "$dest/bin/criu")', not ${REPORTS[$side_version]}; rebuilding it"
    fi
    SKIP_CRIT=1
else
    criu_bin=$(command -v criu || true)
    if [ -n "$criu_bin" ] && criu_version_ok "$criu_bin" && crit_ok; then
        log "criu $("$criu_bin" --version | sed -n 's/^Version: *//p') at $criu_bin is recent enough; nothing to do"
        exit 0
    fi
    if [ -n "$tarball_version" ]; then
        version_at_least "${REPORTS[$tarball_version]}" 4 2 \
            || die "CRIU_TARBALL=$CRIU_TARBALL is CRIU $tarball_version, older than 4.2; build it side by side with --version $tarball_version"
        CRIU_VERSION=$tarball_version
    fi
    dest=$PREFIX
fi

[ "$(id -u)" = 0 ] || die "run as root (apt-get and installing into $dest need it)"

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
# One build of a version at a time (a CI run and a hand-run matrix may overlap).
exec 9>"$CRIU_BUILD_DIR/.criu-${CRIU_VERSION}.lock"
flock 9
build_log=$CRIU_BUILD_DIR/criu-${CRIU_VERSION}-build.log
tarball="$CRIU_BUILD_DIR/${TARBALL[$CRIU_VERSION]}"
if [ -n "${CRIU_TARBALL:-}" ]; then
    [ "$CRIU_TARBALL" -ef "$tarball" ] || cp -f "$CRIU_TARBALL" "$tarball"
elif [ ! -f "$tarball" ]; then
    [ "$CRIU_VERSION" = 4.2.1 ] \
        || die "no tarball for criu $CRIU_VERSION: pass CRIU_TARBALL=PATH (${TARBALL[$CRIU_VERSION]}) or put it in $CRIU_BUILD_DIR"
    # Debian unstable's source package; only the orig tarball is needed.
    log "downloading criu ${CRIU_VERSION} source from Debian unstable"
    src_list=/etc/apt/sources.list.d/gpucr-unstable-src.list
    echo "deb-src http://deb.debian.org/debian unstable main" > "$src_list"
    apt-get update -qq -o Dir::Etc::sourcelist="$src_list" -o Dir::Etc::sourceparts=- \
        -o APT::Get::List-Cleanup=0
    (cd "$CRIU_BUILD_DIR" && apt-get source --download-only -qq "criu=${CRIU_VERSION}-1" \
        || apt-get source --download-only -qq criu) || true
    rm -f "$src_list"
    [ -f "$tarball" ] || die "could not download ${TARBALL[$CRIU_VERSION]}; pass CRIU_TARBALL=PATH"
fi
echo "${SHA256[$CRIU_VERSION]}  $tarball" | sha256sum -c --quiet - \
    || die "$tarball: sha256 mismatch (expected ${SHA256[$CRIU_VERSION]})"

src="$CRIU_BUILD_DIR/${SRCDIR[$CRIU_VERSION]}"
if [ ! -x "$src/criu/criu" ] || [ "$(reported_version "$src/criu/criu")" != "${REPORTS[$CRIU_VERSION]}" ]; then
    log "building criu ${CRIU_VERSION} in $src"
    rm -rf "$src"
    tar -C "$CRIU_BUILD_DIR" -xf "$tarball"
    [ -d "$src" ] || die "${TARBALL[$CRIU_VERSION]} did not unpack into $src"
    make -C "$src" -j"$(nproc)" criu >"$build_log" 2>&1 \
        || { tail -n 30 "$build_log" >&2; die "criu build failed (log: $build_log)"; }
fi
install -D -m 0755 "$src/criu/criu" "$dest/bin/criu"
if [ -n "$side_version" ]; then
    echo "${SHA256[$CRIU_VERSION]}" >"$dest/.gpucr-criu-source"
fi
log "installed $dest/bin/criu ($("$dest/bin/criu" --version | sed -n 's/^Version: *//p'))"

if [ "$SKIP_CRIT" != 1 ] && ! crit_ok; then
    log "installing crit into $CRIT_VENV"
    make -C "$src" crit >>"$build_log" 2>&1 \
        || { tail -n 30 "$build_log" >&2; die "crit build failed"; }
    rm -rf "$CRIT_VENV"
    /usr/bin/python3 -m venv --system-site-packages "$CRIT_VENV" \
        || die "python3 -m venv $CRIT_VENV failed"
    (cd "$src" && "$CRIT_VENV/bin/python" -m pip install -q --no-index --no-build-isolation \
        --no-deps ./lib ./crit) >>"$build_log" 2>&1 \
        || { tail -n 30 "$build_log" >&2; die "crit install into $CRIT_VENV failed"; }
    ln -sfn "$CRIT_VENV/bin/crit" "$PREFIX/bin/crit"
    hash -r
    crit_ok || die "crit was installed but does not run"
    log "installed crit at $(command -v crit)"
fi
