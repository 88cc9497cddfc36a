//! `qsim examples`: the files embedded in the binary (every shipped
//! experiment, model, measured data set and trace), usable anywhere as
//! `builtin:PATH`; `qsim examples PATH` prints one, to copy and edit.

use crate::cli::common::{CliError, Format};
use qsim_sim::config::ConfigError;
use qsim_sim::embedded::{self, PREFIX};
use qsim_sim::report::table::Table;

#[derive(clap::Args, Debug)]
pub struct ExamplesArgs {
    /// Print this embedded file (`builtin:models/…` or `models/…`) instead
    /// of the list, e.g. to copy it: `qsim examples models/databricks-claude-haiku-4-5.toml > mine.toml`.
    pub path: Option<String>,
    /// Output format of the list (table or json).
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
}

pub fn run(a: ExamplesArgs) -> Result<(), CliError> {
    if let Some(p) = &a.path {
        let name = p.strip_prefix(PREFIX).unwrap_or(p);
        let text = embedded::get(name).ok_or_else(|| {
            ConfigError::new(p, "", "no such embedded file (`qsim examples` lists them)")
        })?;
        print!("{text}");
        return Ok(());
    }
    let list = embedded::catalogue();
    match a.format {
        Format::Json => println!(
            "{}",
            serde_json::to_string_pretty(&list).expect("plain data serialises")
        ),
        Format::Table => {
            let mut t = Table::new(["file", "kind", "about"]);
            for e in &list {
                let about: String = if e.about.chars().count() > 90 {
                    e.about.chars().take(89).chain(['…']).collect()
                } else {
                    e.about.clone()
                };
                t.row([e.path.clone(), e.kind.clone(), about]);
            }
            print!("{}", t.render());
            println!(
                "\nEvery file is embedded in the binary: give its path (as listed, with builtin:) to any \
                 command, anywhere; relative paths inside it name other embedded files. \
                 `qsim examples PATH` prints one to copy and edit."
            );
        }
        Format::Csv => {
            return Err(
                ConfigError::new("--format", "", "examples lists as a table or JSON").into(),
            )
        }
    }
    Ok(())
}
