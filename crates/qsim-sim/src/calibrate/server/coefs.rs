//! The coefficients a fit moves: dotted paths into the base profile's
//! TOML, set on a copy and loaded by the profile's own loader (so the
//! fitter knows no step-time formula), and the fitted profile's text.

use super::bench::field_err;
use crate::config::ConfigError;
use crate::server::ServerProfile;
use std::fmt::Write as _;

/// A profile with named coefficients set: the base TOML value edited and
/// loaded by the profile's own loader.
pub struct Coefs {
    pub(crate) base: toml::Value,
    file: String,
    pub names: Vec<String>,
    pub start: Vec<f64>,
}

fn lookup<'a>(v: &'a toml::Value, path: &str) -> Option<&'a toml::Value> {
    path.split('.').try_fold(v, |v, k| v.get(k))
}

impl Coefs {
    pub fn new(file: &str, base: toml::Value, names: &[String]) -> Result<Self, ConfigError> {
        ServerProfile::from_value(file, base.clone())?;
        let mut start = Vec::new();
        let mut full = Vec::new();
        for n in names {
            let path = if n.contains('.') {
                n.clone()
            } else {
                format!("iteration.{n}")
            };
            if full.contains(&path) {
                return Err(field_err(
                    "--fit",
                    "--fit",
                    format!("{path} is named twice"),
                ));
            }
            let v = lookup(&base, &path)
                .and_then(|x| x.as_float().or(x.as_integer().map(|i| i as f64)));
            let v = v.ok_or_else(|| {
                field_err(
                    file,
                    &path,
                    "absent or not a number: --fit needs its start value in the profile",
                )
            })?;
            if v.is_nan() || v <= 0.0 {
                return Err(field_err(
                    file,
                    &path,
                    format!("start value must be > 0 to fit it as a factor, got {v}"),
                ));
            }
            full.push(path);
            start.push(v);
        }
        let c = Coefs {
            base,
            file: file.to_string(),
            names: full,
            start,
        };
        // Every coefficient must be a real number the loader takes.
        for (i, n) in c.names.iter().enumerate() {
            let mut x = c.start.clone();
            x[i] *= 1.0 + 1e-9;
            c.profile(&x).map_err(|e| {
                field_err(
                    "--fit",
                    "--fit",
                    format!("{n}: not a fittable real coefficient ({e})"),
                )
            })?;
        }
        Ok(c)
    }

    pub fn value(&self, values: &[f64]) -> toml::Value {
        let mut v = self.base.clone();
        for (n, &x) in self.names.iter().zip(values) {
            let mut cur = &mut v;
            let parts: Vec<&str> = n.split('.').collect();
            for p in &parts[..parts.len() - 1] {
                cur = cur.get_mut(*p).expect("checked in new");
            }
            if let Some(t) = cur.as_table_mut() {
                t.insert(parts[parts.len() - 1].to_string(), toml::Value::Float(x));
            }
        }
        v
    }

    pub fn profile(&self, values: &[f64]) -> Result<ServerProfile, ConfigError> {
        ServerProfile::from_value(&self.file, self.value(values))
    }
}

/// The base profile's text with the fitted values written in place (a
/// coefficient absent from its section is added under the section's
/// header), and a header comment saying where it comes from.
pub fn fitted_toml(
    text: &str,
    names: &[String],
    values: &[f64],
    name: &str,
    comment: &str,
) -> String {
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    for (n, v) in names.iter().zip(values) {
        let (sect, key) = match n.rsplit_once('.') {
            Some((s, k)) => (s.to_string(), k.to_string()),
            None => (String::new(), n.clone()),
        };
        let mut cur = String::new();
        let mut header_at = None;
        let mut done = false;
        for (i, line) in lines.iter_mut().enumerate() {
            let t = line.trim().to_string();
            if t.starts_with('[') {
                cur = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
                if cur == sect {
                    header_at = Some(i);
                }
                continue;
            }
            if cur == sect {
                if let Some((k, _)) = t.split_once('=') {
                    if k.trim() == key {
                        *line = format!("{key} = {v:.6}  # fitted");
                        done = true;
                        break;
                    }
                }
            }
        }
        if !done {
            let at = header_at.map(|h| h + 1).unwrap_or(0);
            lines.insert(at, format!("{key} = {v:.6}  # fitted"));
        }
    }
    for l in lines.iter_mut() {
        if l.trim_start().starts_with("name")
            && l.split_once('=').is_some_and(|(k, _)| k.trim() == "name")
        {
            *l = format!("name = {name:?}");
            break;
        }
    }
    let mut out = String::new();
    for c in comment.lines() {
        let _ = writeln!(out, "# {c}");
    }
    for l in lines {
        let _ = writeln!(out, "{l}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitted_toml_rewrites_values_in_their_section() {
        let t = "kind = \"server\"\nname = \"a\"\n[scheduler]\nx = 1\n[iteration]\nbandwidth_efficiency = 0.67\ncpu_overhead_ms = 0.8\n";
        let out = fitted_toml(
            t,
            &[
                "iteration.bandwidth_efficiency".into(),
                "iteration.gpu_fixed_ms".into(),
            ],
            &[0.5, 0.25],
            "b",
            "hi",
        );
        let v: toml::Value = toml::from_str(&out).unwrap();
        assert_eq!(v["iteration"]["bandwidth_efficiency"].as_float(), Some(0.5));
        assert_eq!(v["iteration"]["gpu_fixed_ms"].as_float(), Some(0.25));
        assert_eq!(v["iteration"]["cpu_overhead_ms"].as_float(), Some(0.8));
        assert_eq!(v["name"].as_str(), Some("b"));
        assert!(out.starts_with("# hi\n"));
    }
}
