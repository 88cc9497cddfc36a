//! Reading an input file, bounded: every file qsim reads as input (an
//! experiment, plan, profile or proxy config; a trace, log, benchmark or
//! rows file given to `compare`, `whatif`, `calibrate`, `replay`, `sweep
//! merge`, `results merge`) is read through [`read_bytes`] or
//! [`read_text`]. Only a regular file is read (a character device such as
//! `/dev/zero`, a FIFO or a directory is refused before anything is read),
//! and at most its kind's cap ([`Kind::cap`]): a larger file is refused
//! with the cap in the reason, never read until memory runs out.
//!
//! It lives here, in the simulation library, because both the library
//! (TOML loading) and the binary (the data files) read inputs, and the
//! binary depends on this crate; `qsim-core` stays I/O-free, and
//! `qsim-results` parses bytes that the binary read through this module.
//! The functions return the reason only: the caller names the file (and
//! field) in its own one-line error.

use std::io::Read;
use std::path::Path;

/// What an input file is, for its size cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A configuration (TOML or JSON written by hand or by qsim): 64 MiB.
    Config,
    /// A data file (decision log, trace, rows, benchmark results, run
    /// tables): 1 GiB.
    Data,
}

/// Cap of a configuration file.
pub const MAX_CONFIG_BYTES: u64 = 64 << 20;
/// Cap of a data file.
pub const MAX_DATA_BYTES: u64 = 1 << 30;

impl Kind {
    /// The most bytes read from a file of this kind.
    pub fn cap(self) -> u64 {
        match self {
            Kind::Config => MAX_CONFIG_BYTES,
            Kind::Data => MAX_DATA_BYTES,
        }
    }
    fn label(self) -> &'static str {
        match self {
            Kind::Config => "a configuration file",
            Kind::Data => "a data file",
        }
    }
}

fn size(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else {
        format!("{b} bytes")
    }
}

fn over(kind: Kind) -> String {
    format!(
        "larger than {}, the most qsim reads from {}",
        size(kind.cap()),
        kind.label()
    )
}

/// The metadata of `path` if it is a regular file, else the reason.
fn regular(path: &Path) -> Result<std::fs::Metadata, String> {
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot read: {e}"))?;
    let ft = meta.file_type();
    if !ft.is_file() {
        let what = if ft.is_dir() {
            "a directory"
        } else {
            special(&ft)
        };
        return Err(format!(
            "cannot read: {what}, not a regular file (qsim reads inputs only from regular files)"
        ));
    }
    Ok(meta)
}

/// Whether `path` is a regular file qsim may read (the reason if not), as
/// [`read_bytes`] checks it, without opening it.
pub fn check(path: &Path) -> Result<(), String> {
    regular(path).map(|_| ())
}

/// The regular file at `path`, opened to be read as a stream (a request
/// trace): the reader holds a bounded buffer and a bounded line (see
/// `trace::read`), so memory does not depend on the file's size and no
/// size cap applies. A FIFO, device or directory is refused as by
/// [`read_bytes`], before anything is read.
pub fn open_stream(path: &Path) -> Result<std::fs::File, String> {
    regular(path)?;
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    // the path may have been replaced between the check and the open
    let ft = f
        .metadata()
        .map_err(|e| format!("cannot read: {e}"))?
        .file_type();
    if !ft.is_file() {
        return Err("cannot read: not a regular file (it changed while being opened)".into());
    }
    Ok(f)
}

/// The bytes of the regular file at `path`, at most `kind.cap()` of them;
/// the error is the reason (one line, without the file's name).
pub fn read_bytes(path: &Path, kind: Kind) -> Result<Vec<u8>, String> {
    let meta = regular(path)?;
    if meta.len() > kind.cap() {
        return Err(format!("cannot read: {} bytes, {}", meta.len(), over(kind)));
    }
    let f = std::fs::File::open(path).map_err(|e| format!("cannot read: {e}"))?;
    let mut buf = Vec::with_capacity(meta.len() as usize);
    // the file may grow after the check: never read more than the cap
    f.take(kind.cap() + 1)
        .read_to_end(&mut buf)
        .map_err(|e| format!("cannot read: {e}"))?;
    if buf.len() as u64 > kind.cap() {
        return Err(format!("cannot read: {}", over(kind)));
    }
    Ok(buf)
}

/// A data file's bytes ([`read_bytes`] with [`Kind::Data`]), as the
/// loader `qsim-results` takes.
pub fn load_data(path: &Path) -> Result<Vec<u8>, String> {
    read_bytes(path, Kind::Data)
}

/// The text of the regular file at `path` (UTF-8), as [`read_bytes`].
pub fn read_text(path: &Path, kind: Kind) -> Result<String, String> {
    String::from_utf8(read_bytes(path, kind)?).map_err(|e| {
        format!(
            "cannot read: not UTF-8 text (byte {})",
            e.utf8_error().valid_up_to()
        )
    })
}

#[cfg(unix)]
fn special(ft: &std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_fifo() {
        "a FIFO"
    } else if ft.is_socket() {
        "a socket"
    } else {
        "a special file"
    }
}

#[cfg(not(unix))]
fn special(_: &std::fs::FileType) -> &'static str {
    "a special file"
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_devices_directories_and_oversized_files() {
        let e = read_bytes(Path::new("/dev/zero"), Kind::Config).unwrap_err();
        assert!(e.contains("a character device, not a regular file"), "{e}");
        let d = std::env::temp_dir();
        let e = read_bytes(&d, Kind::Data).unwrap_err();
        assert!(e.contains("a directory"), "{e}");
        let f = d.join(format!("qsim-input-test-{}", std::process::id()));
        let file = std::fs::File::create(&f).unwrap();
        file.set_len(MAX_CONFIG_BYTES + 1).unwrap(); // sparse
        let e = read_bytes(&f, Kind::Config).unwrap_err();
        assert!(e.contains("larger than 64 MiB"), "{e}");
        std::fs::write(&f, "x = 1\n").unwrap();
        assert_eq!(read_text(&f, Kind::Config).unwrap(), "x = 1\n");
        std::fs::remove_file(&f).unwrap();
    }
}
