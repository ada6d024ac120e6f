# Print an optspec for argparse to handle cmd's options that are independent of any subcommand.
function __fish_gpucr_global_optspecs
    string join \n h/help V/version
end

function __fish_gpucr_needs_command
    # Figure out if the current invocation already has a command.
    set -l cmd (commandline -opc)
    set -e cmd[1]
    argparse -s (__fish_gpucr_global_optspecs) -- $cmd 2>/dev/null
    or return
    if set -q argv[1]
        # Also print the command, so this can be used to figure out what it is.
        echo $argv[1]
        return 1
    end
    return 0
end

function __fish_gpucr_using_subcommand
    set -l cmd (__fish_gpucr_needs_command)
    test -z "$cmd"
    and return 1
    contains -- $cmd[1] $argv
end

complete -c gpucr -n "__fish_gpucr_needs_command" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_needs_command" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "dump" -d 'Checkpoint a process tree into an image directory'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "restore" -d 'Restore a process tree from an image directory'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "inspect" -d 'Show what is in an image directory or a container checkpoint archive, or verify it'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "check-topology" -d 'Show the local GPUs, or whether an image can be restored here'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "migrate" -d 'Move a running process tree to another machine (stop-and-copy, or --post-copy)'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "receive" -d 'Receive a process tree `gpucr migrate` sends, and run it here'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "keygen" -d 'Make a key pair and a self-signed certificate for migrations'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "install-plugin" -d 'Install gpucr\'s CRIU plugin where CRIU loads plugins, for CRIU run by others'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "completions" -d 'Print a shell completion script to stdout'
complete -c gpucr -n "__fish_gpucr_needs_command" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l network-lock -d 'How to lock the network during the dump and the restore [default: skip when there is nothing to lock (no --tcp-established and the tree shares gpucr\'s network namespace), else iptables when iptables-restore is installed, else nftables]' -r -f -a "iptables\t'iptables rules (CRIU\'s default; needs iptables-restore)'
nftables\t'an nftables table (needs CRIU built with libnftables)'
skip\t'no lock: only safe when nothing can reach the connections meanwhile'"
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l timeout -d 'Give up when the tree cannot be frozen within SECS seconds (CRIU\'s --timeout)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l compress -d 'How GPU memory is stored: none, zstd (level 1) or zstd:LEVEL. Chunks that do not compress are stored raw either way, and all-zero chunks are not stored' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l cuda-staging -d 'How a CUDA process\'s GPU memory is moved: host (the driver stages it in the process\'s memory, which CRIU dumps) or custom (the driver maps it into gpucr, which copies it into DIR/gpu like any GPU memory; CUDA 13.4 drivers) [default: custom where the driver offers it, else host]' -r -f -a "host\t'the driver stages GPU memory in the process\'s own memory, which CRIU dumps'
custom\t'the driver maps GPU memory into gpucr, which copies it into DIR/gpu'"
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l jobs -d 'Threads moving GPU memory (default: the number of CPU cores)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l device-timeout -d 'Give up a device step (a driver lock, checkpoint or restore, a task\'s device taken over or recreated) that takes longer than SECS seconds: the dump fails with the tree running on, the restore with nothing left behind. A step that copies device memory gets SECS again each time its copy moves bytes' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l criu -d 'The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin)' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l criu-config -d 'Further CRIU options, from a file in CRIU\'s config format (one long option name per line, without dashes, then its value: `ghost-limit 64M`, `tcp-close`, `external mnt[KEY]:PATH`, `manage-cgroups full`). Checked before anything is touched: options gpucr sets itself (the image directory, CRIU\'s log, leave-running, the network lock, tcp-established, page servers, ...) are refused with the flag to use instead. A dump records the options in the image (`gpucr inspect` shows them); a restore does not reuse them: give a restore the ones it needs. The CRIU gpucr runs reads no other config file: not CRIU\'s own (/etc/criu/default.conf, ~/.criu/default.conf, CRIU_CONFIG_FILE), which a note names when one holds options' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l leave-running -d 'Keep the tree running after the dump instead of killing it. GPU tasks get their devices back after the image is complete; if that fails, the image is kept and gpucr exits 10 naming the task and the failure'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l leave-stopped -d 'Keep the tree after the dump, stopped: every task takes SIGSTOP while CRIU still holds it, so none runs an instruction between the image and the stop, and CRIU lets it go with its network unlocked. `kill -CONT` to each task lets it run on (as after --leave-running); kill it once its image is restored elsewhere. A failed dump leaves the tree running, but for tasks already stopped before it'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l tcp-established -d 'Dump established TCP connections (restored with their sequence numbers; needs a network lock)'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l shell-job -d 'The tree is a shell job: it shares a session or controlling terminal with the caller'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l ext-unix-sk -d 'Allow unix sockets connected to peers outside the tree'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l file-locks -d 'Dump file locks (flock, POSIX and OFD locks)'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l no-page-checksums -d 'Record CRIU\'s memory pages files (pages-*.img) in the manifest by their size only, not their checksum: the dump then reads no page a second time while the tree is frozen (it otherwise digests every page from the tree\'s memory while CRIU copies it; in engine mode, from the file CRIU writes, which on a machine with few cores slows CRIU\'s memory dump: docs/benchmarks.md). A restore and `inspect --verify` then check those files\' sizes, not their contents; every other file keeps its checksum'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l force -d 'Write into DIR even when it is not empty: a previous image\'s files are removed, and a DIR that also holds anything else is refused with nothing removed'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -s v -l verbose -d 'More detail: -v shows every CRIU phase and raises CRIU\'s log level to 4 (debug)'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand dump" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l max-staging -d 'Memory for GPU data read ahead of its buffers (binary units: 512M, 2G)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l jobs -d 'Threads moving GPU memory (default: the number of CPU cores)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l device-timeout -d 'Give up a device step (a driver lock, checkpoint or restore, a task\'s device taken over or recreated) that takes longer than SECS seconds: the dump fails with the tree running on, the restore with nothing left behind. A step that copies device memory gets SECS again each time its copy moves bytes' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l sysfs-root -d 'Read the GPU topology under DIR instead of `/`: DIR/sys/class/kfd/kfd/topology/nodes, DIR/proc/driver/nvidia/gpus and DIR/sys/bus/pci/devices (NVML is not used). For the simulator\'s root, or a copy of another machine\'s files. An image of simulated GPUs is checked against GPUCR_SIM_ROOT when this is not given' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l skip-check -d 'Do not apply the topology check NAME (repeatable). CRIU\'s variables KFD_FW_VER_CHECK, KFD_SDMA_FW_VER_CHECK, KFD_CACHES_COUNT_CHECK, KFD_NUM_GWS_CHECK, KFD_VRAM_SIZE_CHECK, KFD_NUMA_CHECK and KFD_CAPABILITY_CHECK (0/NO off, 1/YES on) switch the same checks' -r -f -a "simd_count\t''
mem_banks_count\t''
max_waves_per_simd\t''
lds_size_in_kb\t''
wave_front_size\t''
array_count\t''
simd_arrays_per_engine\t''
cu_per_simd_array\t''
simd_per_cu\t''
max_slots_scratch_cu\t''
vendor_id\t''
device_id\t''
num_sdma_engines\t''
num_sdma_xgmi_engines\t''
num_sdma_queues_per_engine\t''
num_cp_queues\t''
vram_public\t''
io_links_count\t''
capability\t''
vram_size\t''
num_gws\t''
caches_count\t''
fw_version\t''
sdma_fw_version\t''
cpu_links\t''
numa\t''
xgmi_hive\t''
gpu_count\t''"
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l criu -d 'The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin)' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l criu-config -d 'Further CRIU options, from a file in CRIU\'s config format (one long option name per line, without dashes, then its value: `ghost-limit 64M`, `tcp-close`, `external mnt[KEY]:PATH`, `manage-cgroups full`). Checked before anything is touched: options gpucr sets itself (the image directory, CRIU\'s log, leave-running, the network lock, tcp-established, page servers, ...) are refused with the flag to use instead. A dump records the options in the image (`gpucr inspect` shows them); a restore does not reuse them: give a restore the ones it needs. The CRIU gpucr runs reads no other config file: not CRIU\'s own (/etc/criu/default.conf, ~/.criu/default.conf, CRIU_CONFIG_FILE), which a note names when one holds options' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -s d -l detach -d 'Print the restored root pid and return instead of waiting for the tree'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l tcp-established -d 'Restore established TCP connections (on by default when the image has them)'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l shell-job -d 'Restore as a shell job (on by default when the image was dumped as one)'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l ext-unix-sk -d 'Allow unix sockets connected to peers outside the tree'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l file-locks -d 'Restore file locks'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l verify-first -d 'Hash every image file, and check every GPU memory chunk against the GPU index, before CRIU starts. By default the memory pages are hashed and the GPU chunks checked while CRIU restores, and the tree is resumed only once they are verified'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l no-parallel-restore -d 'Read GPU memory only once each task\'s buffers exist and fill them before the task goes on (CRIU 4.1\'s sequential way; for comparison). By default gpucr streams the image from the start while CRIU restores the rest'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l lazy -d 'Restore CPU memory on demand: the tree resumes before its memory is back, and gpucr serves each page as it is touched while streaming the rest in the background, every block checked against the image\'s checksums first. Waiting, gpucr reports when all memory is in; with --detach it returns once the tree runs and a helper of its own serves the rest, its output going to the log (with --json, the report waits until all memory is in). A guard process holds the tasks\' userfaultfds, so that a gpucr killed outright leaves no page to read as zeros: it kills the tree instead. Whenever serving fails (a damaged block: exit 7; Ctrl-C or SIGTERM: exit 130; gpucr killed) the tree is killed and the reason written to lazy-pages.log in the image directory (named on stderr). GPU memory is restored as without --lazy, and the tree resumes once it is back (CUDA host staging: once the processes\' memory is in)'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -s v -l verbose -d 'More detail: -v shows every CRIU phase and raises CRIU\'s log level to 4 (debug)'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand restore" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -s p -l pid -d 'Show only process PID and its descendants (PID as in the image, inside the tree\'s PID namespace)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l ps-tree -d 'Show the process tree (always shown; kept for checkpointctl users)'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l ps-tree-cmd -d 'Show each process\'s argv, read from the dumped memory, instead of its name'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l ps-tree-env -d 'Show each process\'s environment, read from the dumped memory'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l files -d 'Show open files: every descriptor with its type and path, the cwd and root'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l sockets -d 'Show sockets: unix, TCP, UDP, netlink and packet, with addresses, ports, states and buffer and queue sizes'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l mounts -d 'Show the mounts of the tree\'s mount namespaces'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l memory -d 'Show each process\'s memory mappings and how much of each was dumped'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l gpu -d 'Show the GPU state: backend, devices, buffers, sizes and compression'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l stats -d 'Show CRIU\'s dump (and restore) statistics and gpucr\'s phase timings'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l all -d 'Show every section'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l verify -d 'Verify the image instead of showing it; the exit status says intact (0), damaged (7) or incomplete (8)'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand inspect" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand check-topology" -l sysfs-root -d 'Read the GPU topology under DIR instead of `/`: DIR/sys/class/kfd/kfd/topology/nodes, DIR/proc/driver/nvidia/gpus and DIR/sys/bus/pci/devices (NVML is not used). For the simulator\'s root, or a copy of another machine\'s files. An image of simulated GPUs is checked against GPUCR_SIM_ROOT when this is not given' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand check-topology" -l skip-check -d 'Do not apply the topology check NAME (repeatable). CRIU\'s variables KFD_FW_VER_CHECK, KFD_SDMA_FW_VER_CHECK, KFD_CACHES_COUNT_CHECK, KFD_NUM_GWS_CHECK, KFD_VRAM_SIZE_CHECK, KFD_NUMA_CHECK and KFD_CAPABILITY_CHECK (0/NO off, 1/YES on) switch the same checks' -r -f -a "simd_count\t''
mem_banks_count\t''
max_waves_per_simd\t''
lds_size_in_kb\t''
wave_front_size\t''
array_count\t''
simd_arrays_per_engine\t''
cu_per_simd_array\t''
simd_per_cu\t''
max_slots_scratch_cu\t''
vendor_id\t''
device_id\t''
num_sdma_engines\t''
num_sdma_xgmi_engines\t''
num_sdma_queues_per_engine\t''
num_cp_queues\t''
vram_public\t''
io_links_count\t''
capability\t''
vram_size\t''
num_gws\t''
caches_count\t''
fw_version\t''
sdma_fw_version\t''
cpu_links\t''
numa\t''
xgmi_hive\t''
gpu_count\t''"
complete -c gpucr -n "__fish_gpucr_using_subcommand check-topology" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand check-topology" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand check-topology" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l key -d 'This side\'s private key (PEM, mode 0600: a key others may read is refused), as `gpucr keygen` writes it' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l cert -d 'This side\'s certificate (PEM), the one the other side was given as its --peer-cert. It must hold --key\'s public half: a certificate of another key is refused (exit 2) before anything is connected or listened on' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l peer-cert -d 'The other side\'s certificate (PEM): the only one accepted. A peer that does not present it, or cannot sign with its key, is refused during the TLS handshake, before anything else is read' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l link-timeout -d 'Give up when the link stays silent for SECS seconds, or a connection takes longer (each side tells the other it is still working while it dumps or restores)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l staging -d 'Where the staging directory is made (default: the temporary directory)' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l lanes -d 'Carry the memory pages and the GPU data on N connections in parallel beside the control connection (each authenticated as it is; the receiver grants at most 8). Each connection sends, checks and writes its own chunks, so more of them keep more cores busy on a fast link' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l compress -d 'How the GPU memory crosses: none, zstd (level 1) or zstd:LEVEL, as `gpucr dump --compress` stores it (the image on the destination keeps it so). zstd sends fewer bytes at the cost of the source\'s and the destination\'s CPU: on a link faster than the cores compress, none moves the job sooner' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l network-lock -d 'How to lock the network during the dump and the restore [default: skip when there is nothing to lock (no --tcp-established and the tree shares gpucr\'s network namespace), else iptables when iptables-restore is installed, else nftables]' -r -f -a "iptables\t'iptables rules (CRIU\'s default; needs iptables-restore)'
nftables\t'an nftables table (needs CRIU built with libnftables)'
skip\t'no lock: only safe when nothing can reach the connections meanwhile'"
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l timeout -d 'Give up when the tree cannot be frozen within SECS seconds (CRIU\'s --timeout)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l jobs -d 'Threads moving GPU memory (default: the number of CPU cores)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l device-timeout -d 'Give up a device step (a driver lock, checkpoint or restore, a task\'s device taken over or recreated) that takes longer than SECS seconds: the dump fails with the tree running on, the restore with nothing left behind. A step that copies device memory gets SECS again each time its copy moves bytes' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l criu -d 'The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin)' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l criu-config -d 'Further CRIU options, from a file in CRIU\'s config format (one long option name per line, without dashes, then its value: `ghost-limit 64M`, `tcp-close`, `external mnt[KEY]:PATH`, `manage-cgroups full`). Checked before anything is touched: options gpucr sets itself (the image directory, CRIU\'s log, leave-running, the network lock, tcp-established, page servers, ...) are refused with the flag to use instead. A dump records the options in the image (`gpucr inspect` shows them); a restore does not reuse them: give a restore the ones it needs. The CRIU gpucr runs reads no other config file: not CRIU\'s own (/etc/criu/default.conf, ~/.criu/default.conf, CRIU_CONFIG_FILE), which a note names when one holds options' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l post-copy -d 'Post-copy: the destination runs the job as soon as everything but its CPU memory is there (its GPU memory included), and pulls each block of memory from this side when the job first touches it, while the rest streams in behind; every block is checked against the image\'s checksums before the job sees it. The downtime no longer grows with the job\'s memory. This side keeps its stopped copy until every page is in there, then kills it. Once the destination runs the job, the job cannot be saved if the link drops: the destination kills its tree (its memory can no longer come), and this side\'s copy stays stopped (exit 13)'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l tcp-established -d 'Dump established TCP connections (restored with their sequence numbers; needs a network lock)'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l shell-job -d 'The tree is a shell job: it shares a session or controlling terminal with the caller'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l ext-unix-sk -d 'Allow unix sockets connected to peers outside the tree'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l file-locks -d 'Dump file locks (flock, POSIX and OFD locks)'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -s v -l verbose -d 'More detail: -v shows every CRIU phase and raises CRIU\'s log level to 4 (debug)'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand migrate" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l listen -d 'The address and port to listen on' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l dir -d 'The directory beneath which each migration\'s image directory is made' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l key -d 'This side\'s private key (PEM, mode 0600: a key others may read is refused), as `gpucr keygen` writes it' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l cert -d 'This side\'s certificate (PEM), the one the other side was given as its --peer-cert. It must hold --key\'s public half: a certificate of another key is refused (exit 2) before anything is connected or listened on' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l peer-cert -d 'The other side\'s certificate (PEM): the only one accepted. A peer that does not present it, or cannot sign with its key, is refused during the TLS handshake, before anything else is read' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l link-timeout -d 'Give up a migration when the link stays silent for SECS seconds' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l sysfs-root -d 'Read the GPU topology under DIR instead of `/`: DIR/sys/class/kfd/kfd/topology/nodes, DIR/proc/driver/nvidia/gpus and DIR/sys/bus/pci/devices (NVML is not used). For the simulator\'s root, or a copy of another machine\'s files. An image of simulated GPUs is checked against GPUCR_SIM_ROOT when this is not given' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l skip-check -d 'Do not apply the topology check NAME (repeatable). CRIU\'s variables KFD_FW_VER_CHECK, KFD_SDMA_FW_VER_CHECK, KFD_CACHES_COUNT_CHECK, KFD_NUM_GWS_CHECK, KFD_VRAM_SIZE_CHECK, KFD_NUMA_CHECK and KFD_CAPABILITY_CHECK (0/NO off, 1/YES on) switch the same checks' -r -f -a "simd_count\t''
mem_banks_count\t''
max_waves_per_simd\t''
lds_size_in_kb\t''
wave_front_size\t''
array_count\t''
simd_arrays_per_engine\t''
cu_per_simd_array\t''
simd_per_cu\t''
max_slots_scratch_cu\t''
vendor_id\t''
device_id\t''
num_sdma_engines\t''
num_sdma_xgmi_engines\t''
num_sdma_queues_per_engine\t''
num_cp_queues\t''
vram_public\t''
io_links_count\t''
capability\t''
vram_size\t''
num_gws\t''
caches_count\t''
fw_version\t''
sdma_fw_version\t''
cpu_links\t''
numa\t''
xgmi_hive\t''
gpu_count\t''"
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l jobs -d 'Threads moving GPU memory (default: the number of CPU cores)' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l device-timeout -d 'Give up a device step (a driver lock, checkpoint or restore, a task\'s device taken over or recreated) that takes longer than SECS seconds: the dump fails with the tree running on, the restore with nothing left behind. A step that copies device memory gets SECS again each time its copy moves bytes' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l criu -d 'The criu binary to run (default: `criu` on PATH, then /usr/local/sbin, /usr/sbin)' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l criu-config -d 'Further CRIU options, from a file in CRIU\'s config format (one long option name per line, without dashes, then its value: `ghost-limit 64M`, `tcp-close`, `external mnt[KEY]:PATH`, `manage-cgroups full`). Checked before anything is touched: options gpucr sets itself (the image directory, CRIU\'s log, leave-running, the network lock, tcp-established, page servers, ...) are refused with the flag to use instead. A dump records the options in the image (`gpucr inspect` shows them); a restore does not reuse them: give a restore the ones it needs. The CRIU gpucr runs reads no other config file: not CRIU\'s own (/etc/criu/default.conf, ~/.criu/default.conf, CRIU_CONFIG_FILE), which a note names when one holds options' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l once -d 'Serve one connection, then exit with its outcome'
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -s v -l verbose -d 'More detail: -v shows every CRIU phase and raises CRIU\'s log level to 4 (debug)'
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -l json -d 'Print the result as one JSON object on stdout (for scripts); no progress output'
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand receive" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand keygen" -l dir -d 'Where to write the files' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand keygen" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand keygen" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -l criu-libdir -d 'CRIU\'s plugin directory' -r -F
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -l setting -d 'A setting for engine mode, NAME=VALUE, written to the settings file beside the plugin: GPUCR_COMPRESS, GPUCR_JOBS, GPUCR_DEVICE_TIMEOUT, CUDA_VISIBLE_DEVICES, the KFD_*_CHECK topology switches, GPUCR_ENGINE=0 (keep out of every CRIU gpucr did not start) and the other GPUCR_* variables engine mode reads (the backends\' GPUCR_AMDGPU_*, GPUCR_SIM_*, GPUCR_CUDA_LIBRARY, ...). A value engine mode would refuse, or a GPUCR_* or KFD_* name it does not read, is refused here. Repeatable. In a settings file edited by hand, the plugin leaves such names, and names without a value, out, with a warning in CRIU\'s log' -r
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -l uninstall -d 'Remove the installed plugin instead'
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -l force -d 'Install even though DIR holds CRIU\'s own cuda_plugin.so or amdgpu_plugin.so. CRIU calls each hook on its plugins in directory order and stops at the first that answers, so for a GPU process either plugin may act and the other never sees it; without this flag the install is refused'
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand install-plugin" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand completions" -s h -l help -d 'Print help (see more with \'--help\')'
complete -c gpucr -n "__fish_gpucr_using_subcommand completions" -s V -l version -d 'Print version'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "dump" -d 'Checkpoint a process tree into an image directory'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "restore" -d 'Restore a process tree from an image directory'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "inspect" -d 'Show what is in an image directory or a container checkpoint archive, or verify it'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "check-topology" -d 'Show the local GPUs, or whether an image can be restored here'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "migrate" -d 'Move a running process tree to another machine (stop-and-copy, or --post-copy)'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "receive" -d 'Receive a process tree `gpucr migrate` sends, and run it here'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "keygen" -d 'Make a key pair and a self-signed certificate for migrations'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "install-plugin" -d 'Install gpucr\'s CRIU plugin where CRIU loads plugins, for CRIU run by others'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "completions" -d 'Print a shell completion script to stdout'
complete -c gpucr -n "__fish_gpucr_using_subcommand help; and not __fish_seen_subcommand_from dump restore inspect check-topology migrate receive keygen install-plugin completions help" -f -a "help" -d 'Print this message or the help of the given subcommand(s)'
