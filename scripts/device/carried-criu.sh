# shellcheck shell=bash
# Sourced by the device scripts: use the CRIU carried in DEV (.device, made by pack.sh).
# CRIU's own libraries (Debian 12's, in DEV/lib) are given to CRIU alone, through a
# wrapper in WORK/bin, so that Python and PyTorch keep the machine's.
#
#   use_carried_criu DEV WORK     puts WORK/bin and DEV/bin first on PATH, sets GPUCR_CRIU
use_carried_criu() {
    local dev=$1 work=$2
    mkdir -p "$work/bin"
    # shellcheck disable=SC2016 # the wrapper expands LD_LIBRARY_PATH when it runs
    printf '#!/bin/sh\nLD_LIBRARY_PATH=%s/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} exec %s/bin/criu "$@"\n' \
        "$dev" "$dev" > "$work/bin/criu"
    chmod +x "$work/bin/criu"
    export PATH=$work/bin:$dev/bin:$PATH
    export GPUCR_CRIU=$work/bin/criu
}
