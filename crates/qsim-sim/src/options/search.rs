//! `qsim options --fewest`: each option's search — the fewest units or
//! replicas of a pure option ([`super::fewest`]), the cheapest mix of a
//! hybrid ([`super::mix`]).

use super::fewest::{self, Found};
use super::{is_hybrid, mix, OptionsFile, Targets};

/// The fewest count of option `i` that meets `targets`, run with `seed`
/// (a hybrid: its cheapest mix).
pub fn search(file: &OptionsFile, i: usize, seed: u64, targets: &Targets) -> Found {
    if is_hybrid(&file.options[i]) {
        mix::search(file, i, seed, targets)
    } else {
        fewest::search(file, i, seed, targets)
    }
}
