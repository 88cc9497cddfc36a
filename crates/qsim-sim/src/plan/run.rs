//! `qsim plan` end to end: check the work budget, build, size by `--need`
//! ([`super::inverse`]), simulate every seed, find, and render. Kept out of
//! the parent module so the parts it orchestrates (budget, inverse, seeds,
//! findings, render) import the parent's types one way.

use super::config::SharedFile;
use super::{build, findings, flag_err, inverse, parse_need, render, seeds, simulate};
use super::{PlanError, PlanSpec};
use crate::report::records::Records;

/// `qsim plan`: check the work budget, build, simulate, and render (table or JSON).
pub fn run_cli(
    args: &PlanSpec,
    as_json: bool,
    budget: &crate::budget::Budget,
) -> Result<String, PlanError> {
    run_cli_full(args, as_json, budget).map(|r| r.text)
}

/// What [`run_cli_full`] made: the report, the file as planned (sized by
/// `--need` if given) and the records of every seed (for plots and HTML).
pub struct PlanRun {
    pub text: String,
    pub file: SharedFile,
    pub records: Records,
}

/// [`run_cli`], also returning the planned file and the seeds' records.
pub fn run_cli_full(
    args: &PlanSpec,
    as_json: bool,
    budget: &crate::budget::Budget,
) -> Result<PlanRun, PlanError> {
    let need = args.need.as_deref().map(parse_need).transpose()?;
    let e2e = args.e2e_p95.map(crate::time::to_secs);
    if e2e.is_some() && need.is_none() {
        return Err(flag_err("--e2e-p95", "needs --need").into());
    }
    let (mut file, model) = build(args)?;
    let mut spent = super::budget::simulate(&file, &model)?.times(args.seeds as f64, "seeds");
    spent.check(&file.source, budget)?;
    let mut inverse_json = None;
    if let Some(need) = &need {
        let (g, v) = inverse::plan(&file, &model, need, e2e, args.seed, budget, &mut spent)?;
        if let Some(g) = g {
            file = g;
        }
        inverse_json = Some(v);
    }
    let runs = simulate(&file, &model, args.seed, true);
    // more seeds: each reduced to records at once (nothing else is kept)
    let mut recs = Records::default();
    seeds::records(&mut recs, args.seed, &runs);
    for k in 1..args.seeds {
        let s = args.seed.wrapping_add(k);
        seeds::records(&mut recs, s, &simulate(&file, &model, s, true));
    }
    // the run-time work budget: the results are partial if it ran out
    crate::work::check(&file.source)?;
    let over_seeds = (args.seeds > 1).then(|| recs.spreads());
    let mut fs = findings::static_findings(&file, need.as_deref());
    fs.extend(findings::sim_findings(&file, &runs));
    let plan = render::Plan {
        file: &file,
        model: &model,
        seed: args.seed,
        findings: fs,
        flow: findings::decision_flow(&file),
        runs,
        inverse: inverse_json,
    };
    let text = match (as_json, &over_seeds) {
        (true, None) => crate::report::json_text(&render::json(&plan)),
        (false, None) => render::table(&plan),
        (true, Some(s)) => {
            let mut v = render::json(&plan);
            v["over_seeds"] = seeds::json(&plan.runs, s, args.seed);
            crate::report::json_text(&v)
        }
        (false, Some(s)) => render::table(&plan) + &seeds::table(&plan.runs, s, args.seed),
    };
    Ok(PlanRun {
        text,
        file,
        records: recs,
    })
}
