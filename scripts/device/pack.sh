#!/usr/bin/env bash
# Pack what the GPU validation machine lacks into .device/ (ignored by git), to be
# carried there with the working tree: release builds of gpucr, its CRIU plugin, the
# fake CUDA driver and the workloads (stripped), CRIU with the shared libraries it needs
# beyond glibc, and hyperfine. Run on the build machine (Debian 12, x86-64):
#
#   scripts/device/pack.sh
#
# then on the GPU machine, from the repository root, with .device carried:
#
#   bash scripts/device/cuda-validate.sh
#
# The machine has no package registry, so everything the validation runs comes from
# here; its glibc must be at least Debian 12's (2.36).
set -euo pipefail
trap 'printf "pack: failed (exit status %s): %s\n" "$?" "$BASH_COMMAND" >&2' ERR
cd "$(dirname "$0")/../.."
out=.device
command -v criu >/dev/null || scripts/install-criu.sh
command -v hyperfine >/dev/null || apt-get install -y -qq --no-install-recommends hyperfine >/dev/null
cargo build --release --workspace --lib --bins --examples -q
rm -rf "$out"
mkdir -p "$out/bin" "$out/examples" "$out/lib"
cp target/release/gpucr "$out/bin/"
for example in sim_workload workload cuda_workload checkpoint_cycle cuda_ctl; do
    cp "target/release/examples/$example" "$out/examples/"
done
cp target/release/libgpucr_plugin.so target/release/libgpucr_fake_cuda.so "$out/lib/"
strip "$out"/bin/* "$out"/examples/* "$out"/lib/*.so
cp "$(command -v criu)" "$(command -v hyperfine)" "$out/bin/"
# CRIU's libraries, except glibc's own (the machine has those).
ldd "$(command -v criu)" | awk '/=> \// {print $3}' |
    grep -vE '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*)\.so' |
    while read -r lib; do cp -L "$lib" "$out/lib/"; done
criu --version | head -1 | sed "s/^Version: /CRIU /" > "$out/VERSIONS"
git rev-parse --short HEAD | sed 's/^/gpucr commit /' >> "$out/VERSIONS"
size=$(du -sm "$out" | cut -f1)
echo "packed $out: ${size} MiB ($(ls "$out"/bin "$out"/examples "$out"/lib | grep -c .) files)"
if [ "$size" -ge 60 ]; then
    echo "pack: $out is ${size} MiB, too close to the 64 MiB a device call carries" >&2
    exit 1
fi
