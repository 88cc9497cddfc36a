//! Input-token estimate before forwarding.
//!
//! A stated approximation, not a tokenizer: `ceil(chars / 4)` of the text in
//! `messages[].content` (strings, or `text` parts), `prompt`, `input` and
//! `inputs`, plus 4 tokens per message (role and separators), at least 1.
//! OpenAI's rule of thumb for English is ~4 characters per token; the
//! upstream's `usage.prompt_tokens` is the truth, and only the output side is
//! settled against it (the core's `complete` settles output tokens).

use serde_json::Value;

/// Characters of text in a JSON value: a string, an array of strings or of
/// `{ "text": … }` parts, or such a part.
fn text_chars(v: &Value) -> u64 {
    match v {
        Value::String(s) => s.chars().count() as u64,
        Value::Array(a) => a.iter().map(text_chars).sum(),
        Value::Object(o) => o.get("text").map(text_chars).unwrap_or(0),
        _ => 0,
    }
}

/// A prompt given as token ids (`[1, 2, 3]`), or a batch of such prompts
/// (`[[1, 2], [3]]`): the number of ids.
fn token_ids(v: &Value) -> Option<u64> {
    let a = v.as_array()?;
    if a.is_empty() {
        return None;
    }
    if a.iter().all(Value::is_u64) {
        return Some(a.len() as u64);
    }
    a.iter()
        .map(|p| {
            let p = p.as_array()?;
            (!p.is_empty() && p.iter().all(Value::is_u64)).then_some(p.len() as u64)
        })
        .sum()
}

/// Input tokens of an OpenAI-style request body: exactly the ids of a
/// completions prompt given as token ids (what an engine computes), else
/// the estimate `ceil(chars / 4)` + 4 per chat message.
pub fn input_tokens(body: &Value) -> u64 {
    if let Some(n) = body.get("prompt").and_then(token_ids) {
        return n;
    }
    let mut chars = 0;
    let mut messages = 0;
    if let Some(ms) = body.get("messages").and_then(Value::as_array) {
        for m in ms {
            messages += 1;
            chars += m.get("content").map(text_chars).unwrap_or(0);
        }
    }
    for k in ["prompt", "input", "inputs"] {
        if let Some(v) = body.get(k) {
            chars += text_chars(v);
        }
    }
    (chars.div_ceil(4) + 4 * messages).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn chars_over_four_plus_message_overhead() {
        let b = json!({"messages": [
            {"role": "system", "content": "12345678"},
            {"role": "user", "content": [{"type": "text", "text": "abcd"}]}
        ]});
        assert_eq!(input_tokens(&b), 2 + 1 + 8);
        assert_eq!(input_tokens(&json!({"prompt": "abcde"})), 2);
        assert_eq!(input_tokens(&json!({"prompt": ["ab", "cd"]})), 1);
        assert_eq!(input_tokens(&json!({})), 1);
        // token ids count exactly, one prompt or a batch
        assert_eq!(input_tokens(&json!({"prompt": [5, 6, 7]})), 3);
        assert_eq!(input_tokens(&json!({"prompt": [[5, 6], [7]]})), 3);
        assert_eq!(input_tokens(&json!({"prompt": []})), 1);
        assert_eq!(input_tokens(&json!({"prompt": [5, "x"]})), 1);
    }
}
