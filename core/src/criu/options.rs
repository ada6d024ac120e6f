//! CRIU 4.2's long options as its getopt table has them (`long_opts` in criu/config.c):
//! each name, whether it takes a value, and the form of the values CRIU parses as a
//! number or one of a fixed set of words. A `--criu-config` line is checked against it,
//! since CRIU refuses a line it cannot read before it opens its log, and reads some
//! malformed values without a word (`ghost-limit abc` is a limit of 0). The values CRIU
//! takes apart (`veth-pair`, `join-ns`, ...) are checked in [`super::structured`].

/// Whether an option takes a value (getopt's `has_arg`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg {
    None,
    Required,
    Optional,
}

/// `(name, has_arg, boolean)`: a boolean option (CRIU's `BOOL_OPT`) also has a `no-`
/// form, which takes no value either.
const LONG_OPTS: &[(&str, Arg, bool)] = &[
    ("tree", Arg::Required, false),
    ("leave-stopped", Arg::None, false),
    ("leave-running", Arg::None, false),
    ("restore-detached", Arg::None, true),
    ("restore-sibling", Arg::None, true),
    ("daemon", Arg::None, true),
    ("images-dir", Arg::Required, false),
    ("work-dir", Arg::Required, false),
    ("log-file", Arg::Required, false),
    ("join-ns", Arg::Required, false),
    ("root", Arg::Required, false),
    ("ext-unix-sk", Arg::Optional, false),
    ("help", Arg::None, false),
    ("tcp-established", Arg::None, true),
    ("close", Arg::Required, false),
    ("log-pid", Arg::None, true),
    ("version", Arg::None, false),
    ("evasive-devices", Arg::None, true),
    ("pidfile", Arg::Required, false),
    ("veth-pair", Arg::Required, false),
    ("action-script", Arg::Required, false),
    ("link-remap", Arg::None, true),
    ("shell-job", Arg::None, true),
    ("file-locks", Arg::None, true),
    ("page-server", Arg::None, true),
    ("address", Arg::Required, false),
    ("port", Arg::Required, false),
    ("prev-images-dir", Arg::Required, false),
    ("ms", Arg::None, false),
    ("track-mem", Arg::None, true),
    ("auto-dedup", Arg::None, true),
    ("libdir", Arg::Required, false),
    ("cpu-cap", Arg::Optional, false),
    ("force-irmap", Arg::None, true),
    ("ext-mount-map", Arg::Required, false),
    ("exec-cmd", Arg::None, false),
    ("manage-cgroups", Arg::Optional, false),
    ("cgroup-root", Arg::Required, false),
    ("inherit-fd", Arg::Required, false),
    ("feature", Arg::Required, false),
    ("skip-mnt", Arg::Required, false),
    ("enable-fs", Arg::Required, false),
    ("enable-external-sharing", Arg::None, false),
    ("enable-external-masters", Arg::None, false),
    ("freeze-cgroup", Arg::Required, false),
    ("ghost-limit", Arg::Required, false),
    ("irmap-scan-path", Arg::Required, false),
    ("lsm-profile", Arg::Required, false),
    ("timeout", Arg::Required, false),
    ("external", Arg::Required, false),
    ("empty-ns", Arg::Required, false),
    ("lazy-pages", Arg::None, false),
    ("extra", Arg::None, true),
    ("experimental", Arg::None, true),
    ("all", Arg::None, false),
    ("cgroup-props", Arg::Required, false),
    ("cgroup-props-file", Arg::Required, false),
    ("cgroup-dump-controller", Arg::Required, false),
    ("skip-in-flight", Arg::None, true),
    ("deprecated", Arg::None, true),
    ("display-stats", Arg::None, true),
    ("weak-sysctls", Arg::None, true),
    ("status-fd", Arg::Required, false),
    ("tcp-close", Arg::None, true),
    ("verbosity", Arg::Optional, false),
    ("ps-socket", Arg::Required, false),
    ("stream", Arg::None, true),
    ("config", Arg::Required, false),
    ("no-default-config", Arg::None, false),
    ("tls-cacert", Arg::Required, false),
    ("tls-cacrl", Arg::Required, false),
    ("tls-cert", Arg::Required, false),
    ("tls-key", Arg::Required, false),
    ("tls", Arg::None, true),
    ("tls-no-cn-verify", Arg::None, false),
    ("cgroup-yard", Arg::Required, false),
    ("pre-dump-mode", Arg::Required, false),
    ("file-validation", Arg::Required, false),
    ("skip-file-rwx-check", Arg::None, true),
    ("lsm-mount-context", Arg::Required, false),
    ("network-lock", Arg::Required, false),
    ("mntns-compat-mode", Arg::None, true),
    ("unprivileged", Arg::None, true),
    ("ghost-fiemap", Arg::None, true),
    ("allow-uprobes", Arg::None, true),
];

/// Every name getopt knows, `no-` forms included, with whether it takes a value.
fn every_name() -> impl Iterator<Item = (String, Arg)> {
    LONG_OPTS.iter().flat_map(|&(name, arg, boolean)| {
        let negated = boolean.then(|| (format!("no-{name}"), Arg::None));
        std::iter::once((name.to_owned(), arg)).chain(negated)
    })
}

/// The option `name` selects, as getopt_long finds it: the option of that name, else the
/// one option whose name it begins (an abbreviation). Its full name and `has_arg`; an
/// unknown or ambiguous name is an error saying so.
pub fn resolve(name: &str) -> Result<(String, Arg), String> {
    let mut matches: Vec<(String, Arg)> = Vec::new();
    for (full, arg) in every_name() {
        if full == name {
            return Ok((full, arg));
        }
        if full.starts_with(name) {
            matches.push((full, arg));
        }
    }
    match matches.len() {
        0 => Err(format!("`{name}` is not an option of CRIU 4.2")),
        1 => Ok(matches.remove(0)),
        _ => Err(format!(
            "`{name}` is ambiguous: it abbreviates {}",
            matches
                .iter()
                .map(|(m, _)| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

/// Why CRIU would refuse `name` with `value`, or misread it; None when CRIU reads it as
/// written. `name` is checked against CRIU's option table, the value against whether the
/// option takes one and, where CRIU parses it, against the form CRIU accepts.
pub fn check(name: &str, value: Option<&str>) -> Option<String> {
    let (full, arg) = match resolve(name) {
        Ok(found) => found,
        Err(why) => return Some(why),
    };
    match (arg, value) {
        (Arg::None, Some(v)) => {
            return Some(format!(
                "`{full}` takes no value, and this line gives it {v:?}"
            ))
        }
        (Arg::Required, None) => {
            return Some(format!(
                "`{full}` needs a value{}",
                example(&full).map_or(String::new(), |e| format!(" (e.g. `{full} {e}`)"))
            ))
        }
        _ => {}
    }
    if full == "ms" {
        return Some("`ms` is deprecated: CRIU refuses it".into());
    }
    let value = value?;
    let words = |allowed: &[&str]| {
        (!allowed.contains(&value)).then(|| {
            format!(
                "`{full}` takes one of {}, not {value:?}",
                allowed.join(", ")
            )
        })
    };
    match full.as_str() {
        "ghost-limit" => (!is_size(value)).then(|| {
            format!(
                "`ghost-limit` takes a size in bytes, with K, M or G (upper case) for KiB, \
                 MiB or GiB, not {value:?} (CRIU would read it as {} bytes)",
                read_like_atol(value)
            )
        }),
        "manage-cgroups" => words(&["none", "props", "soft", "full", "strict", "ignore"]),
        "file-validation" => words(&["filesize", "buildid"]),
        "empty-ns" => words(&["net"]),
        "cpu-cap" => (!is_cpu_cap(value)).then(|| {
            format!(
                "`cpu-cap` takes fpu, cpu, ins, all or none, separated by `,`, each may \
                 be negated with `^`; not {value:?}"
            )
        }),
        "close" => (!value.bytes().all(|b| b.is_ascii_digit()) || value.is_empty())
            .then(|| format!("`close` takes a descriptor number, not {value:?}")),
        _ => super::structured::check(&full, value),
    }
}

/// A value to show in "needs a value" for the options where one is well known.
fn example(name: &str) -> Option<&'static str> {
    match name {
        "ghost-limit" => Some("64M"),
        "external" => Some("mnt[/mnt/data]:data"),
        "veth-pair" => Some("eth0=veth0"),
        "join-ns" => Some("net:/var/run/netns/x"),
        "ext-mount-map" => Some("/mnt/data:data"),
        "file-validation" => Some("filesize"),
        "empty-ns" => Some("net"),
        _ => None,
    }
}

/// A size as CRIU's `parse_size` reads it correctly: digits, then at most one of K, M, G.
/// (CRIU takes the number `atol` finds and multiplies it when the value holds K, M or G
/// anywhere: `64m` would be 64 bytes, `8MK` 8 KiB, `abc` 0.)
fn is_size(value: &str) -> bool {
    let digits = value.trim_end_matches(['K', 'M', 'G']);
    !digits.is_empty()
        && digits.bytes().all(|b| b.is_ascii_digit())
        && value.len() - digits.len() <= 1
}

/// The number `atol` reads at the start of `value` (0 when there is none).
fn read_like_atol(value: &str) -> u64 {
    let digits: String = value
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().unwrap_or(0)
}

/// A `cpu-cap` value as CRIU's `parse_cpu_cap` accepts it.
fn is_cpu_cap(mut value: &str) -> bool {
    while let Some(c) = value.chars().next() {
        if c == '^' || c == ',' {
            value = &value[1..];
            continue;
        }
        match ["fpu", "all", "none", "cpu", "ins"]
            .iter()
            .find(|w| value.starts_with(*w))
        {
            Some(w) => value = &value[w.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_as_getopt_finds_them() {
        assert_eq!(
            resolve("tcp-close").unwrap(),
            ("tcp-close".into(), Arg::None)
        );
        assert_eq!(resolve("no-tcp-close").unwrap().1, Arg::None);
        assert_eq!(resolve("ghost-l").unwrap().0, "ghost-limit");
        // An exact name wins over the longer names it begins.
        assert_eq!(resolve("tls").unwrap().0, "tls");
        assert_eq!(resolve("cgroup-props").unwrap().0, "cgroup-props");
        assert!(resolve("bogusoption")
            .unwrap_err()
            .contains("not an option"));
        assert!(resolve("no-tcp-est").is_ok());
        assert!(resolve("no-ghost-limit").is_err(), "not a boolean");
        let e = resolve("cgroup").unwrap_err();
        assert!(
            e.contains("ambiguous") && e.contains("`cgroup-root`"),
            "{e}"
        );
    }

    #[test]
    fn what_criu_refuses_or_misreads_is_named() {
        for (name, value, why) in [
            ("bogusoption", None, "not an option of CRIU"),
            ("ghost-limit", None, "needs a value"),
            ("external", None, "needs a value"),
            ("tcp-close", Some("yes"), "takes no value"),
            ("no-link-remap", Some("1"), "takes no value"),
            ("manage-cgroups", Some("bogus"), "one of none, props"),
            ("ghost-limit", Some("abc"), "read it as 0 bytes"),
            ("ghost-limit", Some("64m"), "read it as 64 bytes"),
            ("ghost-limit", Some("8MK"), "upper case"),
            ("ghost-limit", Some("-1"), "size in bytes"),
            ("file-validation", Some("sha"), "filesize, buildid"),
            ("empty-ns", Some("pid"), "one of net"),
            ("cpu-cap", Some("gpu"), "`cpu-cap` takes"),
            ("close", Some("x"), "descriptor number"),
            ("ms", None, "deprecated"),
            ("veth-pair", Some("eth0"), "IN=OUT[@BRIDGE]"),
            ("veth", Some("eth0"), "`veth-pair` takes"),
            ("join-ns", Some("pid:1"), "NS:FILE"),
            ("ext-mount-map", Some("data"), "KEY:VALUE"),
            ("external", Some("mnt[]:x"), "mnt[KEY]:VALUE"),
            ("veth-pair", None, "e.g. `veth-pair eth0=veth0`"),
        ] {
            let got = check(name, value).unwrap_or_default();
            assert!(got.contains(why), "{name} {value:?}: {got:?}");
        }
    }

    #[test]
    fn what_criu_reads_as_written_passes() {
        for (name, value) in [
            ("tcp-close", None),
            ("no-tcp-close", None),
            ("ghost-limit", Some("64M")),
            ("ghost-limit", Some("1048576")),
            ("ghost-limit", Some("0")),
            ("ghost-l", Some("2G")),
            ("manage-cgroups", None),
            ("manage-cgroups", Some("full")),
            ("cpu-cap", None),
            ("cpu-cap", Some("^fpu,ins")),
            ("file-validation", Some("buildid")),
            ("external", Some("mnt[/data]:d")),
            ("lsm-profile", Some("apparmor:x")),
            ("skip-in-flight", None),
            ("close", Some("7")),
            ("veth-pair", Some("eth0=veth0@br0")),
            ("join-ns", Some("user:1234,0,0")),
        ] {
            assert_eq!(check(name, value), None, "{name} {value:?}");
        }
    }
}
