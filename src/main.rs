use clap::Parser;

fn main() {
    // Parquet traces are read through qsim-results (polars)
    qsim::commands::trace_parquet::register();
    let cli = match qsim::cli::Cli::try_parse() {
        Ok(c) => c,
        // --help and --version print as clap prints them (exit 0)
        Err(e) if !e.use_stderr() => e.exit(),
        // usage errors: one line, exit 2
        Err(e) => {
            eprintln!("qsim: {}", qsim::cli::common::usage_error_line(&e));
            std::process::exit(2);
        }
    };
    if let Err(e) = qsim::cli::run(cli) {
        eprintln!("qsim: {e}");
        std::process::exit(e.exit_code());
    }
}
