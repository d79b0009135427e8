//! `layerfs policy check FILE` and `layerfs policy explain FILE PATH`.

use super::exit::{Context, Outcome, EXIT_OK};
use std::path::{Component, Path, PathBuf};

use clap::Subcommand;

use crate::policy::Policy;

#[derive(Subcommand, Debug)]
pub enum PolicyCmd {
    /// Parse a policy file; print OK, or the error with its line number.
    #[command(after_help = "Example:\n  layerfs policy check /etc/layerfs/policy")]
    Check {
        /// The policy file to check (the format: layerfs-policy(5)).
        #[arg(value_name = "FILE")]
        file: PathBuf,
    },
    /// Say which rule decides PATH (relative to the mount root) and why, and
    /// which `scratch` lines match it.
    #[command(
        after_help = "Examples:\n  layerfs policy explain policy skills/deploy.md\n  layerfs policy explain policy /app/.env"
    )]
    Explain {
        /// The policy file to read (the format: layerfs-policy(5)).
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
    pub fn run(self) -> Outcome {
        match self {
            PolicyCmd::Check { file } => {
                Policy::load(&file).or_fail("policy check")?;
                outln!("{}: OK", file.display());
            }
            PolicyCmd::Explain { file, path } => {
                let rel = mount_relative(&path).or_usage("policy explain")?;
                let p = Policy::load(&file).or_fail("policy explain")?;
                outln!("{}", p.explain(&rel));
            }
        }
        Ok(EXIT_OK)
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
