#!/usr/bin/env bash
# Clean-room check: run the README's set-up and demo in a minimal Debian 12 root that has
# nothing but what `scripts/setup.sh` installs, so a package the project forgets to name
# fails here instead of on a user's new machine.
#
#   scripts/check-fresh.sh [--tests] [--keep]        (as root)
#
#   --tests   also run the README's test command (scripts/test.sh) inside the root
#   --keep    keep the work directory (the root, its logs) after a failure
#
# Steps:
#   1. a minbase bookworm root from Debian's packages (mmdebstrap), cached as a tarball
#      under $GPUCR_FRESH_CACHE (default /var/cache/gpucr/fresh), keyed by the Date of the
#      bookworm package lists, so a root is built once per archive update;
#   2. a fresh copy of it, with the host's apt sources and apt.conf.d (bookworm hosts) and
#      resolv.conf, and a clean clone of the checked-out commit in /root/gpucr;
#   3. a mount namespace of its own: every mount is made rslave before anything else, so
#      no unmount inside reaches the host; /proc is a new instance, /sys and /dev are
#      recursive binds, /dev/shm a private tmpfs, the Rust toolchain a read-only bind;
#      pivot_root into the root and the host's tree is detached (no bare chroot: CRIU reads
#      mountinfo and must see one consistent tree);
#   4. inside: scripts/setup.sh, then scripts/demo.sh (then scripts/test.sh with --tests),
#      each with a clean environment;
#   5. every process left in the namespace is killed, which takes every mount with it, and
#      the check makes sure no mount of the work directory is left on the host.
#
# A failure names the step and the command that failed, with the end of its log.
# Environment: CRIU_TARBALL=PATH is handed to the set-up inside (CI does this with its
# local copy); RUST_TOOLCHAIN=DIR picks the toolchain (default: `rustc --print sysroot`).
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
cache=${GPUCR_FRESH_CACHE:-/var/cache/gpucr/fresh}
suite=bookworm
run_tests=0
keep=0
for arg in "$@"; do
    case $arg in
        --tests) run_tests=1 ;;
        --keep) keep=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "check-fresh: unknown argument $arg (see --help)" >&2; exit 2 ;;
    esac
done

log() { printf 'check-fresh: %s\n' "$*" >&2; }
step="start"
fail() {
    log "FAILED at step '$step': $*"
    exit 1
}
# run LOG CMD...: run CMD with its output in LOG; on failure name the step and command.
run() {
    local out=$1; shift
    local rc=0
    "$@" >"$out" 2>&1 || rc=$?
    if [ "$rc" -ne 0 ]; then
        tail -n 40 "$out" | sed 's/^/    | /' >&2
        fail "command exited with status $rc: $* (log: $out)"
    fi
}
start_step() { step=$1; log "[$(date +%T)] $step"; }
trap 'log "FAILED at step '"'"'$step'"'"': command exited with status $?: $BASH_COMMAND"' ERR

[ "$(id -u)" = 0 ] || { log "error: run as root (mmdebstrap, mount namespaces, CRIU need it)"; exit 1; }
git -C "$repo" rev-parse --verify -q HEAD >/dev/null || { log "error: $repo is not a git checkout"; exit 1; }

work=""
ns_holder=""
cleanup() {
    local rc=$?
    if [ -n "$ns_holder" ]; then
        kill_namespace "$ns_holder"
    fi
    if [ -n "$work" ] && grep -qF " $work/" /proc/self/mountinfo; then
        log "error: mounts of $work are left on the host:"
        grep -F " $work/" /proc/self/mountinfo >&2
        rc=1
    elif [ -n "$work" ]; then
        if [ "$rc" -ne 0 ] && [ "$keep" = 1 ]; then
            log "kept $work"
        else
            rm -rf --one-file-system "$work"
        fi
    fi
    exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# kill_namespace NSFILE: SIGKILL every process in the mount namespace whose identity is
# recorded in NSFILE (as readlink /proc/PID/ns/mnt), until none is left. The namespace,
# and with it every mount made in it, goes away with its last process.
kill_namespace() {
    local ns pid left
    ns=$(cat "$1" 2>/dev/null) || return 0
    [ -n "$ns" ] || return 0
    for _ in $(seq 50); do
        left=0
        for p in /proc/[0-9]*; do
            pid=${p#/proc/}
            if [ "$(readlink "$p/ns/mnt" 2>/dev/null)" = "$ns" ]; then
                kill -KILL "$pid" 2>/dev/null || true
                left=1
            fi
        done
        [ "$left" = 0 ] && return 0
        sleep 0.1
    done
    log "warning: processes of namespace $ns survived SIGKILL"
}

start_step "host tools"
need=()
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v git >/dev/null || need+=(git)
command -v unshare >/dev/null || need+=(util-linux)
if [ "${#need[@]}" -gt 0 ]; then
    run /tmp/check-fresh-apt.log apt-get update -qq
    run /tmp/check-fresh-apt.log env DEBIAN_FRONTEND=noninteractive \
        apt-get install -y -qq --no-install-recommends "${need[@]}"
fi
toolchain=${RUST_TOOLCHAIN:-$(rustc --print sysroot 2>/dev/null || true)}
[ -x "$toolchain/bin/cargo" ] || fail "no Rust toolchain with cargo at '$toolchain' (set RUST_TOOLCHAIN)"

# The host's apt configuration goes into the root when the host is bookworm too (its
# sources and proxies are then the right ones); elsewhere mmdebstrap's defaults are used.
host_codename=$(. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}")
apt_sources=()
apt_confs=()
if [ "$host_codename" = "$suite" ]; then
    for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources; do
        [ -s "$f" ] && grep -q "$suite" "$f" && apt_sources+=("$f")
    done
    for f in /etc/apt/apt.conf.d/*; do [ -f "$f" ] && apt_confs+=("$f"); done
fi

start_step "package lists date"
lists=$(mktemp -d /tmp/check-fresh-lists.XXXXXX)
chown _apt "$lists" 2>/dev/null || true
printf 'deb http://deb.debian.org/debian %s main\n' "$suite" >"$lists/sources.list"
main_sources="$lists/sources.list"
[ "${#apt_sources[@]}" -gt 0 ] && main_sources=${apt_sources[0]}
run "$lists/update.log" apt-get -q -o Dir::State::Lists="$lists" \
    -o Dir::Etc::SourceList="$main_sources" -o Dir::Etc::SourceParts=- \
    -o APT::Get::List-Cleanup=0 \
    -o Acquire::IndexTargets::deb::Packages::DefaultEnabled=false \
    -o Acquire::IndexTargets::deb::Translations::DefaultEnabled=false \
    -o Acquire::IndexTargets::deb::DEP-11::DefaultEnabled=false \
    -o Acquire::IndexTargets::deb::DEP-11-icons::DefaultEnabled=false \
    -o Acquire::IndexTargets::deb::DEP-11-icons-small::DefaultEnabled=false update
release=$(ls "$lists"/*_dists_"${suite}"_InRelease 2>/dev/null | head -n1)
[ -n "$release" ] || fail "no ${suite} InRelease was downloaded (log: $lists/update.log)"
lists_date=$(sed -n 's/^Date: //p' "$release" | head -n1)
[ -n "$lists_date" ] || fail "$release has no Date field"
key=$(date -u -d "$lists_date" +%Y%m%dT%H%M%SZ)
rm -rf "$lists"
log "bookworm package lists of $lists_date"

start_step "minimal Debian 12 root"
mkdir -p "$cache"
tarball="$cache/$suite-minbase-$key.tar"
if [ ! -s "$tarball" ]; then
    mm_args=(--variant=minbase --format=tar --quiet)
    for f in "${apt_confs[@]}"; do mm_args+=("--aptopt=$f"); done
    run "$cache/mmdebstrap.log" mmdebstrap "${mm_args[@]}" "$suite" "$tarball.part" "${apt_sources[@]}"
    mv "$tarball.part" "$tarball"
    find "$cache" -maxdepth 1 -name "$suite-minbase-*.tar" ! -name "$(basename "$tarball")" -delete
    log "built $tarball"
else
    log "cached $tarball"
fi

start_step "work root"
work=$(mktemp -d /var/tmp/gpucr-fresh.XXXXXX)
root=$work/root
mkdir "$root"
run "$work/unpack.log" tar -C "$root" -xf "$tarball"
if [ "${#apt_sources[@]}" -gt 0 ]; then
    rm -f "$root/etc/apt/sources.list" "$root"/etc/apt/sources.list.d/*
    for f in "${apt_sources[@]}"; do cp "$f" "$root/etc/apt/sources.list.d/$(basename "$f" | sed 's/^sources\.list$/host.list/')"; done
    for f in "${apt_confs[@]}"; do cp "$f" "$root/etc/apt/apt.conf.d/"; done
fi
cp -L /etc/resolv.conf "$root/etc/resolv.conf"
# The host's network settings travel too (they are the site's, not the project's): its CA
# bundle (a site may inspect TLS, and cargo must reach crates.io through it) and proxies.
net_env=()
host_ca=${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}
if [ -s "$host_ca" ]; then
    mkdir -p "$root/etc/ssl"
    cp -L "$host_ca" "$root/etc/ssl/host-ca-bundle.crt"
    net_env+=(SSL_CERT_FILE=/etc/ssl/host-ca-bundle.crt)
fi
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -n "${!v:-}" ] && net_env+=("$v=${!v}")
done
commit=$(git -C "$repo" rev-parse HEAD)
run "$work/clone.log" git clone -q --no-local --no-checkout "$repo" "$root/root/gpucr"
run "$work/clone.log" git -C "$root/root/gpucr" checkout -q --detach "$commit"
if [ -n "$(git -C "$repo" status --porcelain --untracked-files=no)" ]; then
    log "note: $repo has uncommitted changes; the check runs commit ${commit:0:12}"
fi
rm -rf "$root/root/gpucr/.git"
crit_tarball=""
if [ -n "${CRIU_TARBALL:-}" ]; then
    [ -f "$CRIU_TARBALL" ] || fail "CRIU_TARBALL=$CRIU_TARBALL does not exist"
    cp "$CRIU_TARBALL" "$root/root/criu_4.2.1.orig.tar.xz"
    crit_tarball=/root/criu_4.2.1.orig.tar.xz
fi
mkdir -p "$root/opt/rust"

# The commands run inside, one step each; the runner prints a marker per step so the
# outer script can name the one that failed.
steps=("set-up:scripts/setup.sh" "demo:scripts/demo.sh")
[ "$run_tests" = 1 ] && steps+=("tests:scripts/test.sh")
cat >"$root/root/run-steps.sh" <<'EOF'
#!/bin/bash
# Runs inside the clean root: each argument is NAME:COMMAND.
set -u
cd /root/gpucr
for s in "$@"; do
    name=${s%%:*}; cmd=${s#*:}
    echo "@@step $name $cmd"
    if ! $cmd; then
        echo "@@failed $name $cmd"
        exit 1
    fi
done
echo "@@done"
EOF
chmod +x "$root/root/run-steps.sh"

# Inside the new mount namespace (runs as the namespace's first process).
cat >"$work/enter.sh" <<'EOF'
#!/bin/bash
set -euo pipefail
root=$1 toolchain=$2 nsfile=$3 tarball=$4 net_env=$5; shift 5
readlink /proc/self/ns/mnt >"$nsfile"
# Nothing opened outside may leak in: CRIU refuses a file on a mount it cannot see.
for fd in /proc/self/fd/*; do
    n=${fd##*/}
    [ "$n" -gt 2 ] && eval "exec $n>&-" 2>/dev/null || true
done
# First of all: nothing mounted or unmounted here propagates to the host.
mount --make-rslave /
mount --bind "$root" "$root"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"; mount --make-rslave "$root/sys"
mount --rbind /dev "$root/dev"; mount --make-rslave "$root/dev"
mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$root/dev/shm"
mount --bind "$toolchain" "$root/opt/rust"
mount -o remount,bind,ro "$root/opt/rust"
cd "$root"
mkdir -p .host
pivot_root . .host
cd /
umount -l /.host
rmdir /.host
exec </dev/null
exec env -i HOME=/root USER=root LOGNAME=root TERM=dumb LANG=C.UTF-8 \
    PATH=/opt/rust/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    CARGO_HOME=/root/.cargo CARGO_TERM_COLOR=never ${tarball:+CRIU_TARBALL=$tarball} $net_env \
    /root/run-steps.sh "$@"
EOF
chmod +x "$work/enter.sh"

start_step "inside the root: ${steps[*]}"
ns_holder=$work/mntns
inner_log=$work/inside.log
set +e
trap - ERR
unshare --mount --fork -- "$work/enter.sh" "$root" "$toolchain" "$ns_holder" "$crit_tarball" \
    "${net_env[*]}" \
    "${steps[@]}" </dev/null 2>&1 | tee "$inner_log" | while IFS= read -r line; do
        case $line in
            @@step*) log "[$(date +%T)] inside: ${line#@@step }" ;;
            @@*) ;;
            *) printf '    %s\n' "$line" ;;
        esac
    done
status=${PIPESTATUS[0]}
set -e
trap 'log "FAILED at step '"'"'$step'"'"': command exited with status $?: $BASH_COMMAND"' ERR
kill_namespace "$ns_holder"
ns_holder=""
if grep -q '^@@done' "$inner_log"; then
    what="set-up and demo"
    [ "$run_tests" = 1 ] && what="set-up, demo and tests"
    log "[$(date +%T)] passed: $what ran in a fresh Debian 12 root (commit ${commit:0:12})"
    exit 0
fi
failed=$(sed -n 's/^@@failed //p' "$inner_log" | tail -n1)
if [ -n "$failed" ]; then
    step="inside the root: ${failed%% *}"
    where="whole log: $inner_log"
    [ "$keep" = 1 ] || where="rerun with --keep to keep the root and its log"
    fail "command failed: ${failed#* } (exit status $status; $where)"
fi
step="entering the root"
fail "the namespace set-up failed (exit status $status; log: $inner_log)"
