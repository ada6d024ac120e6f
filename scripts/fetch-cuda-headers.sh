#!/usr/bin/env bash
# Fetch the real cuda.h (and cudaTypedefs.h) of every CUDA version gpucr supports, from
# NVIDIA's runtime wheels on PyPI, into a cache:
#
#   scripts/fetch-cuda-headers.sh           fetch what is missing, verify everything
#   scripts/fetch-cuda-headers.sh --list    print the versions (CUDA_VERSION wheel-version)
#
# The cache is $GPUCR_CUDA_HEADERS_DIR, default /var/cache/gpucr/cuda-headers, laid out as
# <wheel version>/cuda.h and <wheel version>/cudaTypedefs.h. Each wheel is downloaded with
# `pip download --no-deps` at an exact version, its sha256 checked against the one pinned
# here, and only the two headers are kept (each with its own pinned sha256). A header
# already in the cache with the right sha256 is not fetched again, so a second run needs
# no network. The wheels are 1-3.5 MB each.
#
# cuda-driver/tests/cuda_headers.rs and fake-cuda/tests/cuda_h.rs run this script when a
# header is missing.
set -euo pipefail

log() { printf 'fetch-cuda-headers: %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# CUDA_VERSION  package  wheel-version  wheel-sha256  cuda.h-sha256  cudaTypedefs.h-sha256
# Each wheel is <package with _>-<version>-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl.
VERSIONS=(
"12080 nvidia-cuda-runtime-cu12 12.8.90 adade8dcbd0edf427b7204d480d6066d33902cab2a4707dcfc48a2d0fd44ab90 4568cc9e7a321e47707cd6403980f21ac2e2e55170500d0e0a3f54feb03a9acb 48a7c0bd33a3d7dcf1b222c62a1a315cf8a8a4aaa87b98638f9897911dbfbfa1"
"12090 nvidia-cuda-runtime-cu12 12.9.79 25bba2dfb01d48a9b59ca474a1ac43c6ebf7011f1b0b8cc44f54eb6ac48a96c3 fda3285d055a9f05e40cd76352f9f073d0ab45d42fb5bb0db4bb33b0df506d28 52969c2b6053aa1645dd0cc1e786de4bc20eee962dab32503a9e8f1013fb31e1"
"13000 nvidia-cuda-runtime 13.0.96 7f82250d7782aa23b6cfe765ecc7db554bd3c2870c43f3d1821f1d18aebf0548 64025f81a9d6d2b10e9e11654f3523e5b046d01b883f0b9ca474e463274b80d4 da2352ecb06115c252394c9ba72472d1dc525569d30f9c83e2da300fce788f2f"
"13010 nvidia-cuda-runtime 13.1.80 dac25b52e69050e5a7a84957e6df470a85b185f8f648a99a1ab1dfce027576cf 756c5d0b68c4bf33d279419d5db479d63263abe80c1e476f8899f4b077215bf5 6a72c74d15be4b14a83d68daa529189af403c2b992ab4449c7be7c2d96c5c469"
"13020 nvidia-cuda-runtime 13.2.86 3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0 673873a292718591d75ea3c2e65330b1f8f8278eac3c96b32245418fb0817851 56b0e4ae9c73c49fb0fa30445b2c148387f7e30c217d506189a3c332aec869d4"
"13030 nvidia-cuda-runtime 13.3.29 e04420616e72f563167a7733272992d7e6df6dc5cb54b2f94f9f1520ea9e30c1 31df84e16179b6d97db4b3c0bae7697392a370b41983f4a8962f0e5a8069b577 30d517cfa051f7a498e432eb1a1964abb11c1cd32098125bba3dfef0b059381f"
"13040 nvidia-cuda-runtime 13.4.92 9641f797da20ce1dd8e779b6e96d08cf9ba564cec8e8225458811ee26423f3a5 7a79d67ca888061b1dfbe4739b51ad64f85a2f3ad874947ce09b2c635b4c7072 77eb4072ae5da75bec31c4cf6291967e8ecbd6981ece0d47b07dbbabf781782c"
"13050 nvidia-cuda-runtime 13.5.37 df2b79a8852f10d1fef8c848489c49eebb5754051bf870202a862831412b179d f4250132eae986e244c693f562f81bdaa919c378665228bece23182da33a39b0 0becf4355b73b40411f4aefc87b4dc77f327da7a947b09b31063043169d16fc3"
)
HEADERS=(cuda.h cudaTypedefs.h)

case "${1:-}" in
    --list)
        for line in "${VERSIONS[@]}"; do
            read -r cuda_version _ version _ <<<"$line"
            printf '%s %s\n' "$cuda_version" "$version"
        done
        exit 0 ;;
    "") ;;
    -h|--help) sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (try --help)" ;;
esac

CACHE="${GPUCR_CUDA_HEADERS_DIR:-/var/cache/gpucr/cuda-headers}"

sha256_of() { sha256sum "$1" | cut -d' ' -f1; }

# Whether <version>/<header> is in the cache with the pinned sha256.
cached() {
    local file="$CACHE/$1/$2" want="$3"
    [ -f "$file" ] && [ "$(sha256_of "$file")" = "$want" ]
}

PYTHON="$(command -v python3 || true)"
# A site that inspects TLS names its CA bundle in SSL_CERT_FILE (as cargo and curl read
# it); pip reads only its own setting, so hand it on when pip has none.
if [ -z "${PIP_CERT:-}" ] && [ -n "${SSL_CERT_FILE:-}" ] && [ -s "$SSL_CERT_FILE" ]; then
    export PIP_CERT=$SSL_CERT_FILE
fi
tmp=""
cleanup() { [ -z "$tmp" ] || rm -rf "$tmp"; }
trap cleanup EXIT

fetched=0
for line in "${VERSIONS[@]}"; do
    read -r cuda_version package version wheel_sha cuda_h_sha typedefs_sha <<<"$line"
    if cached "$version" cuda.h "$cuda_h_sha" && cached "$version" cudaTypedefs.h "$typedefs_sha"; then
        continue
    fi
    [ -n "$PYTHON" ] || die "python3 not found: it runs pip, which downloads the CUDA $version wheel"
    "$PYTHON" -m pip --version >/dev/null 2>&1 \
        || die "pip not found (python3 -m pip): install it (Debian: python3-pip) to download the CUDA $version wheel"
    mkdir -p "$CACHE" || die "cannot create the cache directory $CACHE (set GPUCR_CUDA_HEADERS_DIR)"
    [ -w "$CACHE" ] || die "the cache directory $CACHE is not writable (set GPUCR_CUDA_HEADERS_DIR)"
    [ -n "$tmp" ] || tmp="$(mktemp -d "$CACHE/.fetch.XXXXXX")"

    wheel="$tmp/${package//-/_}-$version-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    log "downloading $package==$version (CUDA $cuda_version)"
    if ! "$PYTHON" -m pip download --quiet --no-deps --no-cache-dir --retries 2 --timeout 30 --only-binary=:all: \
            --platform manylinux2014_x86_64 --python-version 3 --implementation py \
            --dest "$tmp" "$package==$version" >"$tmp/pip.log" 2>&1; then
        cat "$tmp/pip.log" >&2
        die "pip could not download $package==$version (is PyPI reachable?)"
    fi
    [ -f "$wheel" ] || die "pip did not leave the expected wheel $(basename "$wheel") in $tmp"
    got="$(sha256_of "$wheel")"
    [ "$got" = "$wheel_sha" ] || die "$(basename "$wheel"): sha256 $got, expected $wheel_sha"

    dest="$CACHE/$version"
    mkdir -p "$dest"
    for header in "${HEADERS[@]}"; do
        if [ "$header" = cuda.h ]; then want="$cuda_h_sha"; else want="$typedefs_sha"; fi
        # 12.x wheels keep the headers in nvidia/cuda_runtime/include, 13.x in nvidia/cu13/include.
        "$PYTHON" - "$wheel" "$header" "$tmp/$header" <<'EOF' || die "cannot extract $header from $(basename "$wheel")"
import sys, zipfile
wheel, header, out = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.endswith("/include/" + header)]
    if len(names) != 1:
        sys.exit(f"{wheel}: expected one */include/{header}, found {names}")
    with open(out, "wb") as f:
        f.write(z.read(names[0]))
EOF
        got="$(sha256_of "$tmp/$header")"
        [ "$got" = "$want" ] || die "$header of $(basename "$wheel"): sha256 $got, expected $want"
        mv -f "$tmp/$header" "$dest/$header"
    done
    rm -f "$wheel"
    log "CUDA $cuda_version: $dest/{cuda.h,cudaTypedefs.h}"
    fetched=$((fetched + 1))
done
log "${#VERSIONS[@]} CUDA versions in $CACHE ($fetched fetched now)"
