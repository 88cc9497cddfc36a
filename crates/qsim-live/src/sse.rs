//! Server-sent events, as the OpenAI streaming APIs use them: the one
//! reader of a stream's `data:` lines (the proxy's usage scan, `qsim
//! replay`, the benchmark client) and the writer of `qsim serve`'s chunks.
//!
//! Lines end with `\n` (a `\r` before it is dropped); a line is a data line
//! when it starts with `data:` (no leading blank: SSE's field name); its
//! payload is the rest, blanks around it trimmed. `data: [DONE]` ends an
//! OpenAI stream. Other fields (`event:`, `id:`, comments) are skipped;
//! each data line is taken as a whole event (the OpenAI streams send one
//! JSON object per line).

use bytes::Bytes;

/// What a data line holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Data<'a> {
    /// `data: [DONE]`.
    Done,
    /// Any other payload (a JSON chunk, as far as the stream is well formed).
    Event(&'a [u8]),
}

/// Splits a stream's bytes, as they arrive, into data lines.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
    /// Bytes of `buf` already split off.
    pos: usize,
}

impl Reader {
    /// Append bytes received.
    pub fn push(&mut self, chunk: &[u8]) {
        if self.pos > 0 {
            self.buf.drain(..self.pos);
            self.pos = 0;
        }
        self.buf.extend_from_slice(chunk);
    }

    /// The next complete data line's payload, if any (call until `None`
    /// after each [`Reader::push`]).
    pub fn next_data(&mut self) -> Option<Data<'_>> {
        loop {
            let rest = &self.buf[self.pos..];
            let n = rest.iter().position(|&b| b == b'\n')?;
            let (start, end) = (self.pos, self.pos + n);
            self.pos = end + 1;
            let line = &self.buf[start..end];
            let line = line.strip_suffix(b"\r").unwrap_or(line);
            let Some(payload) = line.strip_prefix(b"data:") else {
                continue;
            };
            let payload = payload.trim_ascii();
            return Some(if payload == b"[DONE]" {
                Data::Done
            } else {
                Data::Event(payload)
            });
        }
    }
}

/// One event of a JSON payload, as sent: `data: {json}\n\n`.
pub fn event(json: &str) -> Bytes {
    Bytes::from(format!("data: {json}\n\n"))
}

/// The OpenAI stream's end.
pub const DONE: &[u8] = b"data: [DONE]\n\n";

#[cfg(test)]
mod tests {
    use super::*;

    fn all(r: &mut Reader) -> Vec<String> {
        let mut out = Vec::new();
        while let Some(d) = r.next_data() {
            out.push(match d {
                Data::Done => "DONE".to_string(),
                Data::Event(p) => String::from_utf8_lossy(p).into_owned(),
            });
        }
        out
    }

    #[test]
    fn data_lines_across_chunks() {
        let mut r = Reader::default();
        r.push(b"data: {\"a\":1}\n\nda");
        assert_eq!(all(&mut r), ["{\"a\":1}"]);
        r.push(b"ta:{\"b\":2}\r\n: comment\nevent: x\n");
        assert_eq!(all(&mut r), ["{\"b\":2}"]);
        r.push(b"data:  [DONE] \r\n");
        assert_eq!(all(&mut r), ["DONE"]);
        r.push(b" data: indented\ndata: no end");
        assert!(all(&mut r).is_empty());
        r.push(b"\n");
        assert_eq!(all(&mut r), ["no end"]);
        r.push(&event("{}"));
        assert_eq!(all(&mut r), ["{}"]);
        r.push(DONE);
        assert_eq!(all(&mut r), ["DONE"]);
    }
}
