//! The rows a scan read, kept for the replays: a compact binary copy in a
//! temporary file (never in memory), so a replay reads them back instead of
//! parsing the text again (issue 22's replay speed).
//!
//! The scan ([`super::TraceSpec::scan`]) hands every row its reader passes
//! on (after the reordering window, so in time order) to a [`Writer`]; a
//! replay of the scanned spec reads the same rows, in the same order, from
//! a [`CacheReader`]. A row is its time as the zigzag varint of the
//! difference to the previous row's, then input, output and consumer as
//! varints: ~8 bytes for a row of an Azure trace (40 in its text). The file
//! is created new in the temporary directory and unlinked at once where the
//! system allows it (Unix; elsewhere when the last copy of the spec is
//! dropped): readers share the open handle and read at their own offsets.
//! Nothing depends on it: when it cannot be written (no temporary
//! directory, disk full), the replay parses the file as before.

use crate::trace::read::Row;
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The most bytes one row takes: a 64-bit varint and three 32-bit ones.
const MAX_ROW: usize = 10 + 3 * 5;
/// Bytes read at a time.
const CHUNK: usize = 64 << 10;

/// A finished copy: the open file, its length and rows.
#[derive(Debug)]
pub struct RowCache {
    file: File,
    len: u64,
    rows: u64,
    /// Still to remove when dropped (not unlinked at creation).
    path: Option<PathBuf>,
}

impl Drop for RowCache {
    fn drop(&mut self) {
        if let Some(p) = &self.path {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl RowCache {
    /// Rows held.
    pub fn rows(&self) -> u64 {
        self.rows
    }
}

/// A spec's copy of its rows, if it has one. Specs compare equal whatever
/// their copies: a copy holds the rows the spec names, nothing more.
#[derive(Debug, Clone, Default)]
pub struct Copied(pub Option<Arc<RowCache>>);

impl PartialEq for Copied {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

/// Writes the copy as the scan reads; any failure drops it (`finish` → None).
pub struct Writer {
    w: Option<std::io::BufWriter<File>>,
    path: Option<PathBuf>,
    prev: i64,
    rows: u64,
    len: u64,
    buf: [u8; MAX_ROW],
}

fn put(buf: &mut [u8; MAX_ROW], mut n: usize, mut v: u64) -> usize {
    while v >= 0x80 {
        buf[n] = v as u8 | 0x80;
        v >>= 7;
        n += 1;
    }
    buf[n] = v as u8;
    n + 1
}

impl Writer {
    /// A new copy in the temporary directory, or None if none can be made.
    pub fn create() -> Option<Writer> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir();
        let mut file = None;
        for _ in 0..16 {
            let name = format!(
                "qsim-rows-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            let p = dir.join(name);
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&p)
            {
                Ok(f) => {
                    file = Some((f, p));
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(_) => return None,
            }
        }
        let (f, p) = file?;
        // unlinked now where the system allows it: nothing is left behind
        let path = match std::fs::remove_file(&p) {
            Ok(()) => None,
            Err(_) => Some(p),
        };
        Some(Writer {
            w: Some(std::io::BufWriter::with_capacity(CHUNK, f)),
            path,
            prev: 0,
            rows: 0,
            len: 0,
            buf: [0; MAX_ROW],
        })
    }

    /// The next row (in the order the replay will want it).
    #[inline]
    pub fn push(&mut self, r: &Row) {
        let Some(w) = self.w.as_mut() else { return };
        let d = r.t.wrapping_sub(self.prev);
        self.prev = r.t;
        let zz = ((d << 1) ^ (d >> 63)) as u64;
        let mut n = put(&mut self.buf, 0, zz);
        n = put(&mut self.buf, n, r.input as u64);
        n = put(&mut self.buf, n, r.output as u64);
        n = put(&mut self.buf, n, r.consumer as u64);
        if w.write_all(&self.buf[..n]).is_err() {
            self.w = None;
            return;
        }
        self.len += n as u64;
        self.rows += 1;
    }

    /// The copy, if every row was written.
    pub fn finish(mut self) -> Option<Arc<RowCache>> {
        let w = self.w.take()?;
        let file = w.into_inner().ok()?;
        Some(Arc::new(RowCache {
            file,
            len: self.len,
            rows: self.rows,
            path: self.path.take(),
        }))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        // not finished (an error in the file, a failed write): nothing kept
        if let Some(p) = self.path.take() {
            self.w = None;
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Reads a copy back, row by row, at its own offset.
pub struct CacheReader {
    cache: Arc<RowCache>,
    buf: Box<[u8]>,
    pos: usize,
    end: usize,
    /// File offset of `buf[end]`.
    off: u64,
    prev: i64,
    left: u64,
}

impl CacheReader {
    pub fn new(cache: Arc<RowCache>) -> CacheReader {
        let left = cache.rows;
        CacheReader {
            cache,
            buf: vec![0; CHUNK + MAX_ROW].into_boxed_slice(),
            pos: 0,
            end: 0,
            off: 0,
            prev: 0,
            left,
        }
    }

    /// Read more: the unread bytes move to the front.
    #[cold]
    fn refill(&mut self) -> std::io::Result<()> {
        self.buf.copy_within(self.pos..self.end, 0);
        self.end -= self.pos;
        self.pos = 0;
        while self.end < MAX_ROW && self.off < self.cache.len {
            let want = (self.buf.len() - self.end).min((self.cache.len - self.off) as usize);
            let n = read_at(
                &self.cache.file,
                &mut self.buf[self.end..self.end + want],
                self.off,
            )?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            self.end += n;
            self.off += n as u64;
        }
        Ok(())
    }

    #[inline]
    fn varint(&mut self) -> u64 {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = self.buf[self.pos];
            self.pos += 1;
            v |= ((b & 0x7F) as u64) << shift;
            if b < 0x80 {
                return v;
            }
            shift += 7;
        }
    }

    /// The next row (`line` is 0: a copied row's line is not kept), None
    /// after the last.
    #[inline]
    pub fn read_row(&mut self) -> std::io::Result<Option<Row>> {
        if self.left == 0 {
            return Ok(None);
        }
        if self.end - self.pos < MAX_ROW && self.off < self.cache.len {
            self.refill()?;
        }
        self.left -= 1;
        let zz = self.varint();
        let d = ((zz >> 1) as i64) ^ -((zz & 1) as i64);
        let t = self.prev.wrapping_add(d);
        self.prev = t;
        let input = self.varint() as u32;
        let output = self.varint() as u32;
        let consumer = self.varint() as u32;
        Ok(Some(Row {
            t,
            input,
            output,
            consumer,
            line: 0,
        }))
    }
}

#[cfg(unix)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::unix::fs::FileExt::read_at(f, buf, off)
}

#[cfg(windows)]
fn read_at(f: &File, buf: &mut [u8], off: u64) -> std::io::Result<usize> {
    std::os::windows::fs::FileExt::seek_read(f, buf, off)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_come_back_as_written() {
        let mut w = Writer::create().expect("a temporary file");
        let mut rows = Vec::new();
        let mut t = -5_000_000_000i64;
        for k in 0..200_000u64 {
            // gaps of every size, negative times, equal times, large values
            t += match k % 5 {
                0 => 0,
                1 => 1,
                2 => (k * 7919) as i64,
                3 => 1 << 40,
                _ => 12_345_678,
            };
            rows.push(Row {
                t,
                input: (k as u32).wrapping_mul(2_654_435_761) >> (k % 32),
                output: k as u32 % 70_000,
                consumer: (k % 3) as u32,
                line: 0,
            });
        }
        rows.push(Row {
            t: i64::MIN,
            input: u32::MAX,
            output: 0,
            consumer: u32::MAX,
            line: 0,
        });
        rows.push(Row {
            t: i64::MAX,
            input: 0,
            output: u32::MAX,
            consumer: 0,
            line: 0,
        });
        for r in &rows {
            w.push(r);
        }
        let c = w.finish().expect("written");
        assert_eq!(c.rows(), rows.len() as u64);
        // two readers at once, each from the start
        let (mut a, mut b) = (CacheReader::new(c.clone()), CacheReader::new(c));
        for r in &rows {
            assert_eq!(a.read_row().unwrap().as_ref(), Some(r));
            assert_eq!(b.read_row().unwrap().as_ref(), Some(r));
        }
        assert_eq!(a.read_row().unwrap(), None);
        assert_eq!(b.read_row().unwrap(), None);
    }
}
