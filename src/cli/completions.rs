//! `layerfs completions SHELL`: the shell completion script, generated
//! from the clap definition (as `--help` and the man pages are), printed
//! on stdout.

use super::exit::{CliError, Context};
use std::io::Write;

use clap::{Args, CommandFactory};
use clap_complete::Shell;

const COMPLETIONS_HELP: &str = "\
Examples:
  layerfs completions bash > /etc/bash_completion.d/layerfs
  layerfs completions zsh > \"${fpath[1]}/_layerfs\"
  layerfs completions fish > ~/.config/fish/completions/layerfs.fish
  source <(layerfs completions bash)          # this bash session only";

#[derive(Args, Debug)]
#[command(after_help = COMPLETIONS_HELP)]
pub struct CompletionsCmd {
    /// The shell to complete in: bash, zsh, fish, elvish or powershell.
    #[arg(value_name = "SHELL")]
    shell: Shell,
}

impl CompletionsCmd {
    pub fn run(self) -> Result<(), CliError> {
        let mut cmd = super::Cli::command();
        let mut out = Vec::new();
        clap_complete::generate(self.shell, &mut cmd, "layerfs", &mut out);
        let mut stdout = std::io::stdout().lock();
        match stdout.write_all(&out).and_then(|()| stdout.flush()) {
            // A closed pipe (`| head`) ends the output quietly.
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
            r => r.or_fail("completions"),
        }
    }
}
