//! `layerfs policy check FILE` and `layerfs policy explain FILE PATH`.

use std::path::{Component, Path, PathBuf};

use clap::Subcommand;

use crate::policy::Policy;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Parse a policy file; print OK, or the error with its line number.
    #[command(after_help = "Example:\n  layerfs policy check /etc/layerfs/policy")]
    Check {
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Say which rule decides PATH (relative to the mount root) and why.
    #[command(
        after_help = "Examples:\n  layerfs policy explain policy skills/deploy.md\n  layerfs policy explain policy /app/.env"
    )]
    Explain {
        #[arg(value_name = "FILE")]
        file: PathBuf,
        /// A path inside the mount; a leading `/` or `./` is ignored.
        #[arg(value_name = "PATH")]
        path: String,
    },
}

/// `PATH` relative to the mount root: no leading `/` or `./`, no empty or
/// `.` segments; `..` is refused.
fn mount_relative(path: &str) -> Result<String, String> {
    let mut parts = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(s) => parts.push(s.to_string_lossy().into_owned()),
            Component::ParentDir => {
                return Err(format!("{path}: `..` is not allowed in a mount path"))
            }
            Component::Prefix(_) => return Err(format!("{path}: not a mount path")),
        }
    }
    Ok(parts.join("/"))
}

impl PolicyCmd {
    pub fn run(self) -> i32 {
        match self {
            PolicyCmd::Check { file } => match Policy::load(&file) {
                Ok(_) => {
                    outln!("{}: OK", file.display());
                    0
                }
                Err(e) => super::fail("policy check", e),
            },
            PolicyCmd::Explain { file, path } => {
                let rel = match mount_relative(&path) {
                    Ok(r) => r,
                    Err(e) => {
                        super::print_error("policy explain", &e);
                        return 2;
                    }
                };
                match Policy::load(&file) {
                    Ok(p) => {
                        outln!("{}", p.explain(&rel));
                        0
                    }
                    Err(e) => super::fail("policy explain", e),
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::mount_relative;

    #[test]
    fn mount_paths() {
        assert_eq!(mount_relative("/a/b").unwrap(), "a/b");
        assert_eq!(mount_relative("./a//b/").unwrap(), "a/b");
        assert_eq!(mount_relative("a").unwrap(), "a");
        assert_eq!(mount_relative("/").unwrap(), "");
        assert!(mount_relative("a/../b").is_err());
    }
}
