//! `layerfs man DIR` (hidden): writes the manual pages, generated from the
//! clap definitions so they never drift from `--help`: `layerfs.1`, one
//! `layerfs-SUBCOMMAND.1` per subcommand (nested ones as
//! `layerfs-snapshot-save.1`, …), `layerfs-policy.5` for the policy file
//! format, and `mount.fuse.layerfs.8` for the mount(8) helper with its
//! mount options, fstab usage and exit status.

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
    names.push(POLICY_PAGE.to_string());
    names.push(format!("{HELPER_NAME}(8)"));

    let mut written = Vec::new();
    for page in pages {
        let own = page_name(&page);
        let path = dir.join(format!("{}.1", display_name(&page)));
        let mut out = Vec::new();
        render(&page, Man::new(page.clone()).manual("layerfs"), &mut out)?;
        see_also(&names, &own).to_writer(&mut out)?;
        fs::write(&path, portable(&String::from_utf8_lossy(&out)))?;
        written.push(path);
    }
    let path = dir.join("layerfs-policy.5");
    fs::write(&path, portable(&String::from_utf8_lossy(&policy_page()?)))?;
    written.push(path);
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

/// A page as clap_mangen renders it, with `synopsis` in place of its own
/// (which writes a short-only option as `[-s ]` and leaves out what an
/// option takes).
fn render(cmd: &clap::Command, man: Man, out: &mut Vec<u8>) -> io::Result<()> {
    man.render_title(out)?;
    man.render_name_section(out)?;
    synopsis(cmd).to_writer(out)?;
    man.render_description_section(out)?;
    if cmd.get_arguments().any(|a| !a.is_hide_set()) {
        man.render_options_section(out)?;
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        man.render_subcommands_section(out)?;
    }
    if cmd.get_after_long_help().is_some() || cmd.get_after_help().is_some() {
        man.render_extra_section(out)?;
    }
    if cmd.get_version().is_some() {
        man.render_version_section(out)?;
    }
    Ok(())
}

/// `SYNOPSIS`: the command, then each visible option as `[-s|--long
/// VALUE]` (no brackets when required), the positionals as `[NAME]` or
/// `<NAME>` (`...` when repeatable), and `<COMMAND>` when it has
/// subcommands.
fn synopsis(cmd: &clap::Command) -> Roff {
    let mut items = vec![bold(
        cmd.get_bin_name().unwrap_or(cmd.get_name()).to_string(),
    )];
    let value = |a: &clap::Arg| -> Option<String> {
        if !a.get_action().takes_values() {
            return None;
        }
        let names = a
            .get_value_names()
            .map(|v| {
                v.iter()
                    .map(|n| n.to_string())
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_else(|| a.get_id().as_str().to_uppercase());
        Some(names)
    };
    // Options first, then the positionals, as people write the command.
    let (positionals, options): (Vec<&clap::Arg>, Vec<&clap::Arg>) = cmd
        .get_arguments()
        .filter(|a| !a.is_hide_set())
        .partition(|a| a.is_positional());
    for a in options.into_iter().chain(positionals) {
        let repeat = matches!(
            a.get_action(),
            clap::ArgAction::Append | clap::ArgAction::Count
        );
        let (open, close) = if a.is_required_set() {
            ("", "")
        } else {
            ("[", "]")
        };
        items.push(roman(format!(" {open}")));
        if a.is_positional() {
            let name = value(a).unwrap_or_else(|| a.get_id().as_str().to_uppercase());
            items.push(italic(name));
        } else {
            let mut flags = Vec::new();
            if let Some(c) = a.get_short() {
                flags.push(format!("-{c}"));
            }
            if let Some(l) = a.get_long() {
                flags.push(format!("--{l}"));
            }
            for (i, f) in flags.iter().enumerate() {
                if i > 0 {
                    items.push(roman("|"));
                }
                items.push(bold(f.clone()));
            }
            if let Some(v) = value(a) {
                items.push(roman(" "));
                items.push(italic(v));
            }
        }
        items.push(roman(close));
        if repeat || a.get_num_args().is_some_and(|n| n.max_values() > 1) {
            items.push(roman("..."));
        }
    }
    if cmd.get_subcommands().any(|s| !s.is_hide_set()) {
        items.push(roman(" "));
        items.push(italic("COMMAND"));
    }
    let mut r = Roff::new();
    r.control("SH", ["SYNOPSIS"]);
    r.text(items);
    r
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
    synopsis(&HelperCli::command()).to_writer(&mut out)?;
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

/// The policy file's page, as `SEE ALSO` names it.
const POLICY_PAGE: &str = "layerfs-policy(5)";

/// The rule kinds of a policy file: keyword, arguments, meaning.
const POLICY_RULES: &[(&str, &str, &str)] = &[
    (
        "hide",
        "PATTERN",
        "Matching paths are invisible through the mount: lookup answers ENOENT, they are never \
         listed, creating one is EACCES. hide DIR/** hides what is inside DIR, not DIR itself \
         (it lists empty, and rmdir removes it from this workspace's view).",
    ),
    (
        "readonly",
        "PATTERN",
        "Matching paths are visible; every change (write, create, unlink, rename in or out, \
         chmod, setxattr, ...) is EROFS.",
    ),
    (
        "protect",
        "PATTERN",
        "Entries that come from a lower cannot be deleted or renamed away (EPERM); editing \
         copies up as usual, and removing the upper copy reverts to the shared version.",
    ),
    (
        "scratch",
        "PATTERN",
        "Disposable paths such as build output, as layerfs mount --scratch: layerfs diff and \
         snapshots leave them out, layerfs gc empties them. Not an access rule.",
    ),
    (
        "symlinks",
        "contained|any",
        "contained (the default): a symlink may not point outside the workspace (a relative \
         target climbing above the mount root, or an absolute target outside the allow-host \
         prefixes, is EPERM). any: every target is allowed.",
    ),
    (
        "allow-host",
        "PREFIX|none",
        "An absolute host path under which symlink targets are allowed with symlinks \
         contained; repeatable. The defaults are /usr, /bin, /lib, /lib64 and /opt; \
         allow-host none clears the list (later lines add to it again).",
    ),
    (
        "devices",
        "deny|allow",
        "deny (the default): block and character devices are not created through the mount \
         (EPERM; fifos and sockets are fine). allow: they are.",
    ),
    (
        "suid",
        "strip|allow",
        "strip (the default): setuid and setgid bits never stick on files through the mount. \
         allow: they are kept.",
    ),
    (
        "quota",
        "bytes=SIZE inodes=COUNT",
        "Limits on the upper's usage; either or both. Beyond them, writes and creations are \
         EDQUOT. SIZE takes K, M, G or T (powers of 1024), COUNT K or M (powers of 1000).",
    ),
];

/// `layerfs-policy(5)`: the policy file format, every rule kind, the
/// pattern language, precedence and examples.
fn policy_page() -> io::Result<Vec<u8>> {
    let mut r = Roff::new();
    r.control("TH", ["LAYERFS-POLICY", "5", "", "", "layerfs"]);
    r.control("SH", ["NAME"]);
    r.text([roman(
        "layerfs-policy - the path policy file of a layerfs workspace",
    )]);
    r.control("SH", ["SYNOPSIS"]);
    r.text([
        roman("layerfs mount "),
        bold("--policy"),
        roman(" "),
        italic("FILE"),
        roman(" ... ; layerfs policy check "),
        italic("FILE"),
        roman("; layerfs policy explain "),
        italic("FILE PATH"),
    ]);
    r.control("SH", ["DESCRIPTION"]);
    r.text([roman(
        "A policy file says which paths of a workspace are hidden, read-only or protected, \
         which are scratch, where symlinks may point, and the workspace's quota. The \
         filesystem enforces it for every tool. It is given to layerfs mount --policy FILE \
         (or -o policy=FILE), layerfs run --policy FILE, and read again on SIGHUP (a policy \
         that fails to parse then is logged and the previous one kept). Without a file the \
         defaults apply: symlinks contained, the default allow-host prefixes, devices deny, \
         suid strip, no quota.",
    )]);
    r.control("PP", []);
    r.text([roman(
        "The file has one rule a line: a keyword, then its arguments, separated by blanks. \
         Blank lines are ignored; # at the start of a line or after a blank starts a comment \
         (so a pattern may contain #, as in issue#12). Keywords are lower case. An error \
         names its line, and the mount is refused.",
    )]);
    r.control("SH", ["RULES"]);
    for (keyword, args, meaning) in POLICY_RULES {
        r.control("TP", []);
        r.text([bold(*keyword), roman(" "), italic(*args)]);
        r.text([roman(*meaning)]);
    }
    r.control("SH", ["PATTERNS"]);
    r.text([roman(
        "Patterns are gitignore-style globs relative to the mount root, one language for \
         hide, readonly, protect, scratch and --scratch. A pattern without / (a trailing one \
         aside) matches a name at any depth: .env matches .env and app/.env. One with / is \
         anchored at the mount root (a leading / is ignored). * and ? match within one \
         component, [...] a character class; ** as a whole component crosses directories \
         (skills/** is everything beneath skills). \\ escapes the next character. A path is \
         matched when it or one of its ancestors matches. Refused: negation (!; write \\! \
         for a name starting with !), empty patterns and components, . and .. components.",
    )]);
    r.control("SH", ["PRECEDENCE"]);
    r.text([roman(
        "hide, readonly and protect are independent classes: a path gets every class whose \
         rules match it or an ancestor, and layerfs policy explain names, for each class, \
         the latest line that decides it. A directory above a protected or readonly path \
         cannot be renamed or removed while it holds such content. For the settings \
         (symlinks, devices, suid, quota) the later line wins. A path's class never changes \
         by moving it: a rename or hard link that would change what a rule says about a \
         path is refused (EROFS or EPERM).",
    )]);
    r.control("SH", ["EXAMPLES"]);
    r.control("PP", []);
    r.control("RS", ["4"]);
    r.control("nf", []);
    for line in [
        "# an agent workspace",
        "hide       **/.env          # secrets stay invisible",
        "hide       secrets/**",
        "readonly   skills/**        # shared instructions, not to be edited",
        "protect    knowledge/**     # shared notes: edit, never delete",
        "scratch    target/**        # build output: not in diff or snapshots",
        "allow-host /srv/tools       # symlinks into the shared toolchain",
        "quota      bytes=10G inodes=1M",
    ] {
        r.text([roman(line)]);
    }
    r.control("fi", []);
    r.control("RE", []);
    r.control("PP", []);
    r.text([roman(
        "Check it with layerfs policy check FILE (prints OK, or the error with its line; \
         exit 1); ask what it says about a path with layerfs policy explain FILE PATH.",
    )]);
    r.control("SH", ["SEE ALSO"]);
    r.text([roman(
        "layerfs(1), layerfs-mount(1), layerfs-policy-check(1), layerfs-policy-explain(1), \
         layerfs-gc(1), layerfs-run(1)",
    )]);
    let mut out = Vec::new();
    r.to_writer(&mut out)?;
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
