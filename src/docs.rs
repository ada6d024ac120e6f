//! Man pages and shell completions, generated from the clap tree.
//!
//! The committed copies in `man/` and `completions/` are checked against this output by
//! `tests/cli.rs` (`generated_docs_are_fresh`), so they never go stale.

use std::io;

use clap::CommandFactory;
use clap_complete::Shell;
use clap_mangen::roff::{bold, roman, Roff};
use clap_mangen::Man;

use crate::cli::Cli;
use crate::exit_code;

/// Every generated file: (path relative to the repository root, contents).
pub fn render_all() -> io::Result<Vec<(String, Vec<u8>)>> {
    let mut out = Vec::new();
    let root = Cli::command();
    out.push(("man/gpucr.1".to_owned(), root_man_page(root.clone())?));
    for sub in visible_subcommands(&root) {
        let name = format!("gpucr-{}", sub.get_name());
        let page = sub
            .clone()
            .name(name.clone())
            .bin_name(format!("gpucr {}", sub.get_name()))
            .version(env!("CARGO_PKG_VERSION"));
        out.push((format!("man/{name}.1"), man_page(page)?));
    }
    for (shell, file) in [
        (Shell::Bash, "gpucr.bash"),
        (Shell::Zsh, "_gpucr"),
        (Shell::Fish, "gpucr.fish"),
    ] {
        let mut buf = Vec::new();
        clap_complete::generate(shell, &mut completion_command(), "gpucr", &mut buf);
        out.push((format!("completions/{file}"), buf));
    }
    Ok(out)
}

/// gpucr's command tree as its completions offer it: without its hidden subcommands
/// (`engine-helper`, which only gpucr's plugin runs), which clap_complete would list.
pub fn completion_command() -> clap::Command {
    let full = Cli::command();
    let mut root = clap::Command::new(full.get_name().to_owned())
        .version(env!("CARGO_PKG_VERSION"))
        .propagate_version(true)
        .subcommand_required(true)
        .arg_required_else_help(true)
        .after_long_help(crate::cli::exit_status_help());
    if let Some(about) = full.get_about() {
        root = root.about(about.clone());
    }
    visible_subcommands(&full)
        .cloned()
        .fold(root, |cmd, sub| cmd.subcommand(sub))
}

/// The subcommands users see (man pages, completions): not the hidden ones.
fn visible_subcommands(cmd: &clap::Command) -> impl Iterator<Item = &clap::Command> {
    cmd.get_subcommands().filter(|s| !s.is_hide_set())
}

/// gpucr(1): a man page with an ENVIRONMENT section listing every `GPUCR_*` variable.
fn root_man_page(cmd: clap::Command) -> io::Result<Vec<u8>> {
    man_page_with(cmd, environment_section)
}

/// The ENVIRONMENT section: users' variables and the simulator's one by one, the
/// project's test hooks and gpucr's own by name.
fn environment_section(roff: &mut Roff) {
    use gpucr_abi::env::{Audience, VARIABLES};
    roff.control("SH", ["ENVIRONMENT"]);
    roff.text([roman(
        "A variable that backs a flag is read when the flag is not given; set but \
         empty, it counts as unset. Those engine mode reads (gpucr's plugin in a CRIU \
         that a container engine started) may also be set in the plugin's settings \
         file (gpucr install-plugin --setting). gpucr warns about a GPUCR_* variable \
         it does not know, naming the one it resembles.",
    )]);
    let entry = |roff: &mut Roff, name: &str, meaning: &str| {
        roff.control("TP", []);
        roff.text([bold(name)]);
        roff.text([roman(meaning)]);
    };
    let of = |audience| VARIABLES.iter().filter(move |v| v.audience == audience);
    for v in of(Audience::User) {
        entry(roff, v.name, v.meaning);
    }
    entry(
        roff,
        gpucr_topology::nvidia::visible::VARIABLE,
        "the NVIDIA GPUs a restore may map a CUDA process onto, with CUDA's rules",
    );
    entry(
        roff,
        &gpucr_topology::CheckName::env_vars()
            .collect::<Vec<_>>()
            .join(", "),
        "the topology checks' switches, 1/YES or 0/NO, as CRIU's amdgpu plugin reads \
         them (docs/topology.md)",
    );
    roff.control("PP", []);
    roff.text([roman(
        "The GPU simulator (a stand-in for a GPU in tests and demonstrations):",
    )]);
    for v in of(Audience::Simulator) {
        entry(roff, v.name, v.meaning);
    }
    let names = |audience| {
        of(audience)
            .map(|v| v.shown())
            .collect::<Vec<_>>()
            .join(", ")
    };
    roff.control("PP", []);
    roff.text([roman(format!(
        "Test hooks and the project's scripts: {}. Set by gpucr for its plugin, not by \
         users: {}.",
        names(Audience::Testing),
        names(Audience::Internal)
    ))]);
}

/// One man page with gpucr's EXIT STATUS section.
fn man_page(cmd: clap::Command) -> io::Result<Vec<u8>> {
    man_page_with(cmd, |_| {})
}

/// One man page with gpucr's EXIT STATUS section, `extra` sections before it.
fn man_page_with(cmd: clap::Command, extra: impl FnOnce(&mut Roff)) -> io::Result<Vec<u8>> {
    let man = Man::new(cmd.clone())
        .date("")
        .source(format!("gpucr {}", env!("CARGO_PKG_VERSION")));
    let mut buf = Vec::new();
    man.render_title(&mut buf)?;
    man.render_name_section(&mut buf)?;
    man.render_synopsis_section(&mut buf)?;
    man.render_description_section(&mut buf)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(&mut buf)?;
    }
    if cmd.has_subcommands() {
        man.render_subcommands_section(&mut buf)?;
    }
    let mut roff = Roff::new();
    extra(&mut roff);
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in exit_code::ALL {
        roff.control("TP", []);
        roff.text([roman(code.to_string())]);
        roff.text([roman(*meaning)]);
    }
    roff.control("PP", []);
    roff.text([roman(
        "gpucr restore without --detach exits with the restored tree's own status \
         (128 + N when signal N killed it).",
    )]);
    roff.to_writer(&mut buf)?;
    man.render_version_section(&mut buf)?;
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_offer_every_visible_subcommand_and_no_hidden_one() {
        let visible: Vec<String> = visible_subcommands(&Cli::command())
            .map(|s| s.get_name().to_owned())
            .collect();
        assert!(visible.iter().any(|n| n == "check-topology"), "{visible:?}");
        for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut completion_command(), "gpucr", &mut buf);
            let script = String::from_utf8(buf).unwrap();
            for name in &visible {
                assert!(script.contains(name.as_str()), "{shell}: no {name}");
            }
            assert!(
                !script.contains("engine-helper"),
                "{shell} offers engine-helper"
            );
        }
    }
}
