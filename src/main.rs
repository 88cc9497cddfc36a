use clap::Parser;

fn main() {
    let cli = qsim::cli::Cli::parse();
    if let Err(e) = qsim::cli::run(cli) {
        eprintln!("qsim: error: {e}");
        std::process::exit(e.exit_code());
    }
}
