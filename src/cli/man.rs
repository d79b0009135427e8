//! `layerfs man DIR` (hidden): writes the manual pages, generated from the
//! clap definitions so they never drift from `--help`: `layerfs.1`, one
//! `layerfs-SUBCOMMAND.1` per subcommand (nested ones as
//! `layerfs-snapshot-save.1`, …), and `mount.fuse.layerfs.8` for the
//! mount(8) helper with its mount options, fstab usage and exit status.

use super::exit::{CliError, Context};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use clap::{Args, CommandFactory};
use clap_mangen::roff::{bold, italic, roman, Roff};
use clap_mangen::Man;

use super::mount_helper::{HelperCli, EXIT_FAIL, EXIT_USAGE, HELPER_NAME};
use crate::config::{IGNORED_OPTIONS, LAYERFS_OPTIONS};

#[derive(Args, Debug)]
pub struct ManCmd {
    /// Directory to write the pages into (created if missing); install
    /// them with e.g. `install -m 0644 DIR/*.1 /usr/local/share/man/man1/`.
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

impl ManCmd {
    pub fn run(self) -> Result<(), CliError> {
        let files = write_all(&self.dir)
            .map_err(|e| format!("{}: {e}", self.dir.display()))
            .or_fail("man")?;
        for f in files {
            outln!("{}", f.display());
        }
        Ok(())
    }
}

/// Writes every page into `dir`; returns the files written.
pub fn write_all(dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    let mut cmd = super::Cli::command().disable_help_subcommand(true);
    cmd.build();
    let mut pages = Vec::new();
    collect(&cmd, &mut pages);
    let mut names: Vec<String> = pages.iter().map(page_name).collect();
    names.push(format!("{HELPER_NAME}(8)"));

    let mut written = Vec::new();
    for page in pages {
        let own = page_name(&page);
        let path = dir.join(format!("{}.1", display_name(&page)));
        let mut out = Vec::new();
        Man::new(page).manual("layerfs").render(&mut out)?;
        see_also(&names, &own).to_writer(&mut out)?;
        fs::write(&path, portable(&String::from_utf8_lossy(&out)))?;
        written.push(path);
    }
    let path = dir.join(format!("{HELPER_NAME}.8"));
    fs::write(&path, portable(&String::from_utf8_lossy(&helper_page()?)))?;
    written.push(path);
    Ok(written)
}

/// The page with every non-ASCII character written as roff that renders
/// in every locale: man(1) under `LANG=C` formats for plain ASCII, where
/// groff has no glyph for raw UTF-8 such as `…` (and warns). Characters
/// without an ASCII rendering here keep groff's Unicode escape.
fn portable(page: &str) -> String {
    let mut out = String::with_capacity(page.len());
    for c in page.chars() {
        match c {
            c if c.is_ascii() => out.push(c),
            // `\&` keeps a leading `.` from starting a control line.
            '…' => out.push_str("\\&..."),
            '—' => out.push_str("\\(em"),
            '–' => out.push_str("\\(en"),
            '→' => out.push_str("\\(->"),
            '≤' => out.push_str("\\(<="),
            '≥' => out.push_str("\\(>="),
            '×' => out.push_str("\\(mu"),
            '‘' | '’' => out.push_str("\\(aq"),
            '“' | '”' => out.push_str("\\(dq"),
            c => out.push_str(&format!("\\[u{:04X}]", c as u32)),
        }
    }
    out
}

/// The command and every visible subcommand below it, depth first.
fn collect(cmd: &clap::Command, out: &mut Vec<clap::Command>) {
    out.push(cmd.clone());
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        collect(sub, out);
    }
}

fn display_name(cmd: &clap::Command) -> String {
    cmd.get_display_name()
        .unwrap_or_else(|| cmd.get_name())
        .to_string()
}

fn page_name(cmd: &clap::Command) -> String {
    format!("{}(1)", display_name(cmd))
}

fn see_also(names: &[String], own: &str) -> Roff {
    let others: Vec<&str> = names
        .iter()
        .map(String::as_str)
        .filter(|n| *n != own)
        .collect();
    let mut r = Roff::new();
    r.control("SH", ["SEE ALSO"]);
    r.text([roman(format!(
        "{}, mount(8), fstab(5), fuse(8)",
        others.join(", ")
    ))]);
    r
}

/// `mount.fuse.layerfs(8)`: the clap-generated parts of the helper's
/// definition, then its mount options, fstab usage and exit status.
fn helper_page() -> io::Result<Vec<u8>> {
    let man = Man::new(HelperCli::command())
        .section("8")
        .manual("layerfs");
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;

    let mut r = Roff::new();
    r.control("SH", ["MOUNT OPTIONS"]);
    r.text([roman(
        "The options are those of layerfs mount -o, separated by commas; a comma \
         inside a value is written \\, and a colon inside a lowerdir= path \\:.",
    )]);
    for (key, value, meaning) in LAYERFS_OPTIONS {
        r.control("TP", []);
        match value {
            Some(v) => r.text([bold(format!("{key}=")), italic(v)]),
            None => r.text([bold(key)]),
        };
        r.text([roman(meaning)]);
    }
    r.control("PP", []);
    r.text([roman(format!(
        "Accepted and ignored, because mount(8) passes them on and layerfs decides \
         permissions, devices and setuid bits itself: {}, and every x-* or X-* option. \
         Any other option is refused (exit status {EXIT_USAGE}), naming it; with -s it \
         is dropped with a warning.",
        IGNORED_OPTIONS.join(", ")
    ))]);

    r.control("SH", ["FSTAB"]);
    r.text([roman(
        "An fstab line mounts a workspace at boot or with mount DIR; the source field \
         is conventionally layerfs:",
    )]);
    example(
        &mut r,
        "layerfs /mnt/ws fuse.layerfs lowerdir=/srv/base,upperdir=/var/lib/ws/upper,\
         workdir=/var/lib/ws/work,allow_other 0 0",
    );
    r.text([roman(
        "With noauto the line is skipped by mount -a and mounted by mount /mnt/ws. For a \
         lower on a network filesystem, add _netdev and x-systemd.requires=MOUNTPOINT-OF-\
         THE-LOWER so systemd orders the mount after the network and that filesystem.",
    )]);

    r.control("SH", ["UNMOUNTING"]);
    r.text([roman(
        "umount DIR (or layerfs umount DIR, which also waits) ends the FUSE session; the \
         daemon then finishes writing its journal and exits.",
    )]);

    r.control("SH", ["EXIT STATUS"]);
    r.text([roman(format!(
        "As mount(8) expects of a helper: 0 mounted; {EXIT_USAGE} bad invocation or mount \
         options; {EXIT_FAIL} the mount failed (a missing layer, a busy mountpoint, a \
         workspace another daemon serves, …), with the reason on standard error."
    ))]);

    r.control("SH", ["INSTALLATION"]);
    r.text([roman(
        "mount(8) finds the helper as /sbin/mount.fuse.layerfs by absolute path, so the \
         caller's PATH does not matter. layerfs install-helpers creates that symlink to the \
         layerfs binary; layerfs install-helpers --remove removes it.",
    )]);

    r.control("SH", ["SEE ALSO"]);
    r.text([roman(
        "layerfs(1), layerfs-mount(1), layerfs-umount(1), layerfs-install-helpers(1), \
         mount(8), umount(8), fstab(5), systemd.mount(5)",
    )]);
    r.to_writer(&mut out)?;
    out.flush()?;
    Ok(out)
}

fn example(r: &mut Roff, line: &str) {
    r.control("PP", []);
    r.control("RS", ["4"]);
    r.control("nf", []);
    r.text([roman(line)]);
    r.control("fi", []);
    r.control("RE", []);
    r.control("PP", []);
}
