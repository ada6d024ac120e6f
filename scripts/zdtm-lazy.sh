#!/usr/bin/env bash
# CRIU's zdtm static tests through `gpucr dump` + `gpucr restore --lazy` (issue #37). Each
# test runs twice under CRIU's own harness (test/zdtm.py of the CRIU source, flavor h):
#   * criu:  `zdtm.py run --lazy-pages`: criu dump, criu lazy-pages, criu restore --lazy-pages;
#   * gpucr: the same command with zdtm.py's --criu-bin pointed at a shim (this script,
#     --criu-shim) that turns `criu dump` into `gpucr dump PID DIR/gpucr`, `criu restore
#     --lazy-pages` into `gpucr restore --lazy --detach DIR/gpucr` (the pid it prints goes
#     into zdtm's --pidfile), answers `criu lazy-pages` itself (gpucr serves the pages) and
#     runs the real criu for everything else (criu check ...).
# Prints a table: test, CRIU's lazy restore, gpucr --lazy, reason. Results: docs/zdtm-lazy.md.
#
#   scripts/zdtm-lazy.sh [TEST...]     (as root; TEST: a name under test/zdtm/static;
#                                       default: the list below)
#
# Environment: WORK (default /var/tmp/zdtm-work): where the CRIU source is unpacked, the
# tests built and run; CRIU_TARBALL (default /work/shared/deps/criu_4.2.1.orig.tar.xz), of
# the same version as CRIU (default `command -v criu`), which both runs use; GPUCR
# (default target/release/gpucr, not built here); MODES (default "criu gpucr"); NICE
# (default 19): everything runs under `nice -n $NICE`.
# Logs: $WORK/logs/MODE/TEST.log (zdtm.py's output, with gpucr's own output in gpucr mode);
# a failed test keeps its images and logs under $WORK/criu-VERSION/test/dump/zdtm/static/.
#
# The harness is changed in one place, for both runs: with ZDTM_AS_ROOT=1 a test runs as
# root instead of as uid 18943, because CRIU reads a task's rlimits with prlimit(), which
# for another user's task needs CAP_SYS_RESOURCE, which containers like this one lack.
# Options zdtm gives criu that gpucr has no flag for go to gpucr through --criu-config.
# Needs: gcc, make, protoc, a python3 with the protobuf and yaml modules (Debian:
# python3-protobuf, python3-yaml). Exits 0 when every test passing under CRIU's lazy
# restore passes through gpucr too, 1 otherwise.
set -euo pipefail

log() { printf 'zdtm-lazy: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 2; }

# zdtm.py's --criu-bin: criu ACTION ARGS... (see the header).
criu_shim() {
    local action=$1 a log=dump.log dir=. pid='' pidfile='' status_fd='' lazy='' v='' rc=0 img conf
    shift
    case $action in
    dump | restore | lazy-pages) ;;
    *) exec "$ZDTM_LAZY_CRIU" "$action" "$@" ;;
    esac
    local -a flags=() cfg=()
    while [ $# -gt 0 ]; do
        a=$1
        shift
        case $a in
        --no-default-config | --restore-detached | -d) ;;
        --log-file | -o) log=$1; shift ;;
        --images-dir | -D) dir=$1; shift ;;
        --verbosity=* | -v*) v=-v ;;
        --tree | -t) pid=$1; shift ;;
        --pidfile) pidfile=$1; shift ;;
        --status-fd) status_fd=$1; shift ;;
        --timeout) flags+=(--timeout "$1"); shift ;;
        --lazy-pages) lazy=--lazy ;;
        --shell-job | -j) flags+=(--shell-job) ;;
        --ext-unix-sk | -x) flags+=(--ext-unix-sk) ;;
        --file-locks | -l) flags+=(--file-locks) ;;
        --tcp-established) flags+=(--tcp-established) ;;
        --leave-running) flags+=(--leave-running) ;;
        # zdtm.py always passes CRIU's default pre-dump mode; it matters only to pre-dumps
        # (zdtm.py --pre), which gpucr does not make.
        --pre-dump-mode=splice) ;;
        --pre-dump-mode) [ "$1" = splice ] || cfg+=("pre-dump-mode $1"); shift ;;
        --*=*) a=${a#--}; cfg+=("${a%%=*} ${a#*=}") ;;
        --*)
            if [ $# -gt 0 ] && [[ $1 != -* ]]; then
                cfg+=("${a#--} $1")
                shift
            else
                cfg+=("${a#--}")
            fi
            ;;
        *) echo "criu-shim: no gpucr equivalent for criu $action $a" >&2; exit 2 ;;
        esac
    done
    case $log in /*) ;; *) log=$dir/$log ;; esac
    img=$dir/gpucr
    if [ "$action" = lazy-pages ]; then
        # gpucr restore --lazy runs its own lazy-pages server: nothing to start.
        echo "lazy-pages: not started, gpucr restore --lazy serves the pages" >"$log"
        if [ -n "$status_fd" ]; then printf '\0' >&"$status_fd"; fi
        return 0
    fi
    if [ ${#cfg[@]} -gt 0 ]; then
        conf=$dir/gpucr-$action.conf
        printf '%s\n' "${cfg[@]}" >"$conf"
        flags+=(--criu-config "$conf")
        echo "criu-shim: CRIU options through --criu-config: ${cfg[*]}" >&2
    fi
    if [ "$action" = dump ]; then
        [ -n "$pid" ] || { echo "criu-shim: dump without --tree" >&2; exit 2; }
        echo "criu-shim: $ZDTM_LAZY_GPUCR dump $v ${flags[*]} $pid $img" >&2
        "$ZDTM_LAZY_GPUCR" dump $v "${flags[@]}" "$pid" "$img" >"$dir/gpucr-dump.out" 2>&1 || rc=$?
        cat "$img/dump.log" >"$log" 2>/dev/null || : >"$log"
        sed 's/^/gpucr-dump: /' "$dir/gpucr-dump.out" >&2
    else
        echo "criu-shim: $ZDTM_LAZY_GPUCR restore --detach $lazy $v ${flags[*]} $img" >&2
        "$ZDTM_LAZY_GPUCR" restore --detach $lazy $v "${flags[@]}" "$img" \
            >"$dir/gpucr-restore.pid" 2>"$dir/gpucr-restore.out" || rc=$?
        cat "$img/restore.log" >"$log" 2>/dev/null || : >"$log"
        sed 's/^/gpucr-restore: /' "$dir/gpucr-restore.out" >&2
        if [ "$rc" = 0 ] && [ -n "$pidfile" ]; then
            tail -n1 "$dir/gpucr-restore.pid" >"$pidfile"
        fi
    fi
    echo "criu-shim: gpucr $action exited with $rc" >&2
    return "$rc"
}

if [ "${1:-}" = --criu-shim ]; then
    shift
    criu_shim "$@"
    exit
fi

[ "$(id -u)" = 0 ] || die "run as root"
root=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/var/tmp/zdtm-work}
CRIU_TARBALL=${CRIU_TARBALL:-/work/shared/deps/criu_4.2.1.orig.tar.xz}
CRIU=${CRIU:-$(command -v criu || true)}
GPUCR=${GPUCR:-$root/target/release/gpucr}
MODES=${MODES:-criu gpucr}
NICE=${NICE:-19}
[ -x "$CRIU" ] || die "no criu (set CRIU)"
[ -x "$GPUCR" ] || die "no gpucr at $GPUCR (cargo build --release, or set GPUCR)"
if [ $# -gt 0 ]; then
    tests=("$@")
else
    tests=(env00 maps00 maps01 maps02 maps03 maps04 maps05 maps06 maps09 maps10 maps11
        maps12 maps_file_prot grow_map grow_map02 grow_map03 mem-touch mprotect00
        thp_disable uffd-events cow00 cow01 memfd00 memfd01 memfd03 memfd04 memfd05 shmemfd
        shmemfd-priv shm-mp shm-unaligned unlink_mmap00 unlink_mmap01 unlink_mmap02
        ghost_holes00 mlock_setuid pipe00 pipe01 fifo socket_listen sockets00 sockets01
        sk-unix01 sk-unix-rel sk-unix-unconn scm00 socket_udp socket-tcp socket_queues
        socket_aio aio01 pty00 file_shared file_locks00 unlink_fstat00 fd fdt_shared cwd00
        umask00 selfexe00 pthread00 pthread01 pthread_timers posix_timers timers futex
        sigpending sigaltstack signalfd00 timerfd inotify00 epoll poll vfork00 wait00 pid00
        pstree zombie00 pdeath_sig child_subreaper stopped stopped01 sleeping00 caps00
        groups xids00 rlimits00 seccomp_strict seccomp_filter fpu00 fpu01 mmx00 sse00 sse20
        rseq00 membarrier vdso00 sched_prio00 uptime_grow write_read00 write_read01
        mtime_mmap session00 shm)
fi

version=$("$CRIU" --version | awk '/^Version:/ {print $2}')
src=$WORK/criu-$version
mkdir -p "$WORK/bin" "$WORK/logs"
if [ ! -d "$src" ]; then
    log "unpacking $CRIU_TARBALL into $WORK"
    tar -xf "$CRIU_TARBALL" -C "$WORK"
    [ -d "$src" ] || die "$CRIU_TARBALL holds no criu-$version/ (criu is $version)"
fi

# A python3 with the modules zdtm.py and pycriu import, first on PATH: zdtm.py runs
# itself again through its `#!/usr/bin/env python3` line.
py=
for p in /usr/bin/python3 "$(command -v python3 || true)"; do
    if [ -x "$p" ] && "$p" -c 'import google.protobuf, yaml' 2>/dev/null; then py=$p; break; fi
done
[ -n "$py" ] || die "no python3 with the protobuf and yaml modules (python3-protobuf, python3-yaml)"
ln -sf "$py" "$WORK/bin/python3"
export PATH=$WORK/bin:$PATH

# What zdtm.py needs built: the test library (each test is built by zdtm.py when it
# starts it) and pycriu's protobuf modules (lib/pycriu/Makefile's steps, without
# building criu first as the top Makefile would).
log "building zdtm's test library and pycriu in $src"
nice -n "$NICE" make -s -C "$src/test/zdtm/lib" -j2 >/dev/null
pyc=$src/lib/pycriu
if [ ! -f "$pyc/images/pb.py" ] || [ ! -f "$pyc/rpc_pb2.py" ]; then
    protos=()
    for f in "$src"/images/*.proto; do [ "${f##*/}" = rpc.proto ] || protos+=("$f"); done
    (cd "$src" && protoc -I=images/ -I=/usr/include/ --python_out=lib/pycriu/images "${protos[@]#"$src/"}")
    (cd "$src" && "$py" scripts/magic-gen.py criu/include/magic.h lib/pycriu/images/magic.py)
    {
        echo "# Autogenerated. Do not edit!"
        for f in "${protos[@]}"; do
            m=$(basename "$f" .proto)
            m=${m//-/_}_pb2
            [ "$m" = opts_pb2 ] || echo "from .$m import *"
        done
    } >"$pyc/images/pb.py"
    (cd "$src" && protoc -I=images/ --python_out=lib/pycriu images/rpc.proto)
    echo "__version__ = '$version'" >"$pyc/version.py"
fi
(cd "$src/test" && "$py" -c 'import pycriu') || die "pycriu does not import"
zdtm=$src/test/zdtm.py
if ! grep -q ZDTM_AS_ROOT "$zdtm"; then
    sed -i "s/^        if not test_flag(self.__desc, 'suid'):$/        if not test_flag(self.__desc, 'suid') and not os.getenv('ZDTM_AS_ROOT'):/" "$zdtm"
    grep -q ZDTM_AS_ROOT "$zdtm" || die "cannot patch $zdtm (ZDTM_AS_ROOT)"
fi

shim=$WORK/bin/criu-via-gpucr
cat >"$shim" <<EOF
#!/bin/sh
# zdtm.py's --criu-bin for the gpucr run of $root/scripts/zdtm-lazy.sh
exec env ZDTM_LAZY_CRIU='$CRIU' ZDTM_LAZY_GPUCR='$GPUCR' bash '$root/scripts/zdtm-lazy.sh' --criu-shim "\$@"
EOF
chmod +x "$shim"

log "criu $version ($CRIU), $("$GPUCR" --version) ($GPUCR), kernel $(uname -r)"
declare -A result reason
for t in "${tests[@]}"; do
    [ -f "$src/test/zdtm/static/$t.c" ] || { log "no test $t, left out"; continue; }
    for mode in $MODES; do
        bin=$CRIU
        [ "$mode" = gpucr ] && bin=$shim
        mkdir -p "$WORK/logs/$mode"
        out=$WORK/logs/$mode/$t.log
        rc=0
        (cd "$src/test" && ZDTM_AS_ROOT=1 timeout 300 nice -n "$NICE" "$py" zdtm.py run \
            -t "zdtm/static/$t" -f h --lazy-pages --criu-bin "$bin") >"$out" 2>&1 || rc=$?
        if grep -q "Test zdtm/static/$t PASS" "$out"; then
            r=pass why=
            # gpucr restore --lazy says how its pages went in: no line, no lazy restore
            # (a crfail test passes when its dump fails, with no restore).
            if [ "$mode" = gpucr ] && grep -q '^Run criu restore' "$out" &&
                ! grep -q '^gpucr-restore: all memory in' "$out"; then
                r=FAIL why="passed, but gpucr restore --lazy did not report its pages in"
            fi
        elif grep -q '^Skipping ' "$out"; then
            r=skip why=$(sed -n 's/^Skipping [^ ]* (\(.*\))$/\1/p' "$out" | head -n1)
        else
            r=FAIL
            why=$(grep -o 'FAIL at .*[^ #]' "$out" | head -n1 || true)
            [ -n "$why" ] || why="zdtm.py exited with $rc"
            # The first error that says why: gpucr's own, else CRIU's (leaving out the
            # RLIMIT_NOFILE one every run logs here and CRIU's closing lines), else make's.
            e=$(grep -m1 -E 'gpucr: error|criu-shim: no gpucr' "$out" | grep -v RLIMIT_NOFILE |
                sed 's/^gpucr-[a-z]*: //' || true)
            [ -n "$e" ] || e=$(grep -o "Error ([^)]*): .*[^'\"]" "$out" |
                grep -v -E 'RLIMIT_NOFILE|(Dumping|Restoring) FAILED' | head -n1 || true)
            [ -n "$e" ] || e=$(grep -m1 -E 'fatal error|No rule to make' "$out" || true)
            [ -z "$e" ] || why="$why: $e"
        fi
        result[$t,$mode]=$r
        reason[$t,$mode]=${why:0:200}
        log "$t: $mode $r ${why:+($why)}"
    done
done

bad=0
printf '| test | CRIU lazy restore | gpucr --lazy | reason |\n|---|---|---|---|\n'
for t in "${tests[@]}"; do
    [ -n "${result[$t,criu]:-}${result[$t,gpucr]:-}" ] || continue
    c=${result[$t,criu]:--} g=${result[$t,gpucr]:--}
    why=${reason[$t,criu]:-}
    if [ "$g" = FAIL ] && [ "$c" != FAIL ] || [ -z "$why" ]; then why=${reason[$t,gpucr]:-}; fi
    [ "$g" = FAIL ] && [ "$c" != FAIL ] && bad=1
    printf '| %s | %s | %s | %s |\n' "$t" "$c" "$g" "${why//|/\\|}"
done
for mode in $MODES; do
    n=0 p=0 s=0
    for t in "${tests[@]}"; do
        case ${result[$t,$mode]:-} in pass) p=$((p + 1)) ;; skip) s=$((s + 1)) ;; FAIL) n=$((n + 1)) ;; esac
    done
    printf '%s: %d passed, %d failed, %d skipped\n' "$mode" "$p" "$n" "$s"
done
exit "$bad"
