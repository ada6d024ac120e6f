_gpucr() {
    local i cur prev opts cmd
    COMPREPLY=()
    if [[ "${BASH_VERSINFO[0]}" -ge 4 ]]; then
        cur="$2"
    else
        cur="${COMP_WORDS[COMP_CWORD]}"
    fi
    prev="$3"
    cmd=""
    opts=""

    for i in "${COMP_WORDS[@]:0:COMP_CWORD}"
    do
        case "${cmd},${i}" in
            ",$1")
                cmd="gpucr"
                ;;
            gpucr,check-topology)
                cmd="gpucr__subcmd__check__subcmd__topology"
                ;;
            gpucr,completions)
                cmd="gpucr__subcmd__completions"
                ;;
            gpucr,dump)
                cmd="gpucr__subcmd__dump"
                ;;
            gpucr,help)
                cmd="gpucr__subcmd__help"
                ;;
            gpucr,inspect)
                cmd="gpucr__subcmd__inspect"
                ;;
            gpucr,install-plugin)
                cmd="gpucr__subcmd__install__subcmd__plugin"
                ;;
            gpucr,keygen)
                cmd="gpucr__subcmd__keygen"
                ;;
            gpucr,migrate)
                cmd="gpucr__subcmd__migrate"
                ;;
            gpucr,receive)
                cmd="gpucr__subcmd__receive"
                ;;
            gpucr,restore)
                cmd="gpucr__subcmd__restore"
                ;;
            gpucr__subcmd__help,check-topology)
                cmd="gpucr__subcmd__help__subcmd__check__subcmd__topology"
                ;;
            gpucr__subcmd__help,completions)
                cmd="gpucr__subcmd__help__subcmd__completions"
                ;;
            gpucr__subcmd__help,dump)
                cmd="gpucr__subcmd__help__subcmd__dump"
                ;;
            gpucr__subcmd__help,help)
                cmd="gpucr__subcmd__help__subcmd__help"
                ;;
            gpucr__subcmd__help,inspect)
                cmd="gpucr__subcmd__help__subcmd__inspect"
                ;;
            gpucr__subcmd__help,install-plugin)
                cmd="gpucr__subcmd__help__subcmd__install__subcmd__plugin"
                ;;
            gpucr__subcmd__help,keygen)
                cmd="gpucr__subcmd__help__subcmd__keygen"
                ;;
            gpucr__subcmd__help,migrate)
                cmd="gpucr__subcmd__help__subcmd__migrate"
                ;;
            gpucr__subcmd__help,receive)
                cmd="gpucr__subcmd__help__subcmd__receive"
                ;;
            gpucr__subcmd__help,restore)
                cmd="gpucr__subcmd__help__subcmd__restore"
                ;;
            *)
                ;;
        esac
    done

    case "${cmd}" in
        gpucr)
            opts="-h -V --help --version dump restore inspect check-topology migrate receive keygen install-plugin completions help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 1 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__check__subcmd__topology)
            opts="-h -V --sysfs-root --skip-check --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --sysfs-root)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --skip-check)
                    COMPREPLY=($(compgen -W "simd_count mem_banks_count max_waves_per_simd lds_size_in_kb wave_front_size array_count simd_arrays_per_engine cu_per_simd_array simd_per_cu max_slots_scratch_cu vendor_id device_id num_sdma_engines num_sdma_xgmi_engines num_sdma_queues_per_engine num_cp_queues vram_public io_links_count capability vram_size num_gws caches_count fw_version sdma_fw_version cpu_links numa xgmi_hive gpu_count" -- "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__completions)
            opts="-h -V --help --version bash elvish fish powershell zsh"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__dump)
            opts="-v -h -V --leave-running --leave-stopped --tcp-established --shell-job --ext-unix-sk --file-locks --network-lock --timeout --no-page-checksums --force --compress --cuda-staging --jobs --device-timeout --criu --criu-config --verbose --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --network-lock)
                    COMPREPLY=($(compgen -W "iptables nftables skip" -- "${cur}"))
                    return 0
                    ;;
                --timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compress)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cuda-staging)
                    COMPREPLY=($(compgen -W "host custom" -- "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu-config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help)
            opts="dump restore inspect check-topology migrate receive keygen install-plugin completions help"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__check__subcmd__topology)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__completions)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__dump)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__help)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__inspect)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__install__subcmd__plugin)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__keygen)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__migrate)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__receive)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__help__subcmd__restore)
            opts=""
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 3 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__inspect)
            opts="-p -h -V --ps-tree --ps-tree-cmd --ps-tree-env --files --sockets --mounts --memory --gpu --stats --all --pid --verify --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --pid)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                -p)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__install__subcmd__plugin)
            opts="-h -V --criu-libdir --setting --uninstall --force --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --criu-libdir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --setting)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__keygen)
            opts="-h -V --dir --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__migrate)
            opts="-v -h -V --key --cert --peer-cert --link-timeout --staging --post-copy --lanes --compress --tcp-established --shell-job --ext-unix-sk --file-locks --network-lock --timeout --jobs --device-timeout --criu --criu-config --verbose --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --peer-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --link-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --staging)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --lanes)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --compress)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --network-lock)
                    COMPREPLY=($(compgen -W "iptables nftables skip" -- "${cur}"))
                    return 0
                    ;;
                --timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu-config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__receive)
            opts="-v -h -V --listen --dir --key --cert --peer-cert --link-timeout --once --sysfs-root --skip-check --jobs --device-timeout --criu --criu-config --verbose --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --listen)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --dir)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --key)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --peer-cert)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --link-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sysfs-root)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --skip-check)
                    COMPREPLY=($(compgen -W "simd_count mem_banks_count max_waves_per_simd lds_size_in_kb wave_front_size array_count simd_arrays_per_engine cu_per_simd_array simd_per_cu max_slots_scratch_cu vendor_id device_id num_sdma_engines num_sdma_xgmi_engines num_sdma_queues_per_engine num_cp_queues vram_public io_links_count capability vram_size num_gws caches_count fw_version sdma_fw_version cpu_links numa xgmi_hive gpu_count" -- "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu-config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
        gpucr__subcmd__restore)
            opts="-d -v -h -V --detach --tcp-established --shell-job --ext-unix-sk --file-locks --verify-first --max-staging --no-parallel-restore --lazy --jobs --device-timeout --sysfs-root --skip-check --criu --criu-config --verbose --json --help --version"
            if [[ ${cur} == -* || ${COMP_CWORD} -eq 2 ]] ; then
                COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
                return 0
            fi
            case "${prev}" in
                --max-staging)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --jobs)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --device-timeout)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --sysfs-root)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --skip-check)
                    COMPREPLY=($(compgen -W "simd_count mem_banks_count max_waves_per_simd lds_size_in_kb wave_front_size array_count simd_arrays_per_engine cu_per_simd_array simd_per_cu max_slots_scratch_cu vendor_id device_id num_sdma_engines num_sdma_xgmi_engines num_sdma_queues_per_engine num_cp_queues vram_public io_links_count capability vram_size num_gws caches_count fw_version sdma_fw_version cpu_links numa xgmi_hive gpu_count" -- "${cur}"))
                    return 0
                    ;;
                --criu)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                --criu-config)
                    COMPREPLY=($(compgen -f "${cur}"))
                    return 0
                    ;;
                *)
                    COMPREPLY=()
                    ;;
            esac
            COMPREPLY=( $(compgen -W "${opts}" -- "${cur}") )
            return 0
            ;;
    esac
}

if [[ "${BASH_VERSINFO[0]}" -eq 4 && "${BASH_VERSINFO[1]}" -ge 4 || "${BASH_VERSINFO[0]}" -gt 4 ]]; then
    complete -F _gpucr -o nosort -o bashdefault -o default gpucr
else
    complete -F _gpucr -o bashdefault -o default gpucr
fi
