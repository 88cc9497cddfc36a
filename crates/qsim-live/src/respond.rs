//! The proxy's over-limit answer: a 429 in the configured shape (OpenAI,
//! with retry hints and `x-ratelimit-*` headers from the limiter's exact
//! retry time; or Databricks FMAPI), or a 400 for a prompt over
//! `max_input_tokens`.

use crate::app::Gen;
use crate::config::LimitShape;
use crate::http::{error, json_response, json_str, RespBody};
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Response, StatusCode};
use qsim_core::limiter::admission::{Limit, NeverFits, Request as LimRequest, Unit};
use qsim_core::time::{Nanos, NEVER};

/// Milliseconds from `now` to `retry_at`, rounded up.
pub fn wait_ms(retry_at: Nanos, now: Nanos) -> u64 {
    retry_at.saturating_sub(now).div_ceil(1_000_000)
}

/// The answer to a request denied by `limit` until `retry_at`: a 429, or,
/// when no wait can ever admit it (`retry_at` is `NEVER`), a 400 saying
/// which limit it can never fit and by how much (a 403 when the consumer has
/// no capacity at all), so that no client retries it.
///
/// Every such answer carries [`LIMITED_BY`] (the limit's name): a client
/// (`qsim load`) tells the proxy's own refusals from the upstream's 429s,
/// which the proxy forwards as they came.
pub fn limited(
    gen: &Gen,
    req: &LimRequest,
    limit: Limit,
    retry_at: Nanos,
    now: Nanos,
) -> Response<RespBody> {
    let mut r = answer(gen, req, limit, retry_at, now);
    r.headers_mut().insert(
        HeaderName::from_static(LIMITED_BY),
        HeaderValue::from_static(limit.name()),
    );
    r
}

/// The header that marks an answer made by the proxy's limiter (not
/// forwarded from the upstream); its value names the limit.
pub const LIMITED_BY: &str = "x-qsim-limited-by";

fn answer(
    gen: &Gen,
    req: &LimRequest,
    limit: Limit,
    retry_at: Nanos,
    now: Nanos,
) -> Response<RespBody> {
    let consumer = req.consumer;
    let name = &gen.names[consumer];
    if retry_at == NEVER {
        if let Some(nf) = gen.params.never_fits(req) {
            return never_fits(gen, name, nf);
        }
    }
    match gen.cfg.limit_shape {
        LimitShape::Fmapi => {
            let mut b = Vec::with_capacity(128);
            b.extend_from_slice(b"{\"error_code\":\"REQUEST_LIMIT_EXCEEDED\",\"message\":");
            json_str(
                &mut b,
                &format!("Exceeded {} limit for consumer {name}", limit.name()),
            );
            b.push(b'}');
            json_response(StatusCode::TOO_MANY_REQUESTS, b)
        }
        LimitShape::OpenAi => {
            let ms = wait_ms(retry_at, now);
            let pol = gen.cfg.limiter.consumers[consumer].policy;
            let (kind, lim) = match limit {
                Limit::Rpm => ("requests", pol.rpm),
                Limit::TokensPerHour => ("tokens", pol.tokens_per_hour),
                Limit::Concurrent => ("requests", pol.concurrent.map(u64::from)),
                _ => match gen.cfg.limiter.unit {
                    Unit::Rpm => ("requests", Some(gen.cfg.limiter.capacity)),
                    Unit::Tpm => ("tokens", Some(gen.cfg.limiter.capacity)),
                },
            };
            let msg = format!(
                "Rate limit reached for consumer {name} on {}: retry in {}.{:03} s",
                limit.name(),
                ms / 1000,
                ms % 1000
            );
            // OpenAI's `type`: which kind of limit was reached
            let mut r = error(
                StatusCode::TOO_MANY_REQUESTS,
                kind,
                "rate_limit_exceeded",
                &msg,
            );
            let h = r.headers_mut();
            if retry_at != NEVER {
                h.insert(
                    HeaderName::from_static("retry-after"),
                    HeaderValue::from(ms.div_ceil(1000).max(1)),
                );
                h.insert(
                    HeaderName::from_static("retry-after-ms"),
                    HeaderValue::from(ms),
                );
            }
            let (kl, kr, ks) = if kind == "requests" {
                (
                    "x-ratelimit-limit-requests",
                    "x-ratelimit-remaining-requests",
                    "x-ratelimit-reset-requests",
                )
            } else {
                (
                    "x-ratelimit-limit-tokens",
                    "x-ratelimit-remaining-tokens",
                    "x-ratelimit-reset-tokens",
                )
            };
            if let Some(l) = lim {
                h.insert(HeaderName::from_static(kl), HeaderValue::from(l));
            }
            h.insert(HeaderName::from_static(kr), HeaderValue::from_static("0"));
            if retry_at != NEVER {
                if let Ok(v) = HeaderValue::from_str(&format!("{ms}ms")) {
                    h.insert(HeaderName::from_static(ks), v);
                }
            }
            r
        }
    }
}

/// A request no wait can admit: 400 (`request_too_large`, or
/// `max_input_tokens` for a prompt over it), 403 when the consumer has no
/// capacity at all.
fn never_fits(gen: &Gen, name: &str, nf: NeverFits) -> Response<RespBody> {
    let lim = &gen.cfg.limiter;
    let what = |l: Limit| match l {
        Limit::Rpm | Limit::Concurrent => "requests",
        Limit::Capacity if lim.unit == Unit::Rpm => "requests",
        _ => "tokens",
    };
    match nf.limit {
        Limit::MaxInputTokens => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "max_input_tokens",
            &format!(
                "{name}: the prompt (~{} tokens) exceeds max_input_tokens = {}",
                nf.need, nf.largest
            ),
        ),
        Limit::Capacity if nf.largest == 0 => error(
            StatusCode::FORBIDDEN,
            "permission_error",
            "no_capacity",
            &format!(
                "{name}: this consumer has no capacity under {} semantics (every unit is reserved for others)",
                lim.semantics.name()
            ),
        ),
        l => error(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "request_too_large",
            &format!(
                "{name}: this request needs {} {} of the {} limit, which can never hold more than {} for this consumer; lower max_tokens (or the prompt)",
                nf.need,
                what(l),
                l.name(),
                nf.largest
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_rounds_up() {
        assert_eq!(wait_ms(1_000_001, 0), 2);
        assert_eq!(wait_ms(5, 10), 0);
    }
}
