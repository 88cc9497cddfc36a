//! Writing a report: to stdout, or to the regular file named by `--out`.
//!
//! Rules for `--out PATH` (the README's "Output and exit codes" states them
//! for users):
//!
//! - Only regular files are written. A directory, character or block
//!   device, FIFO or socket at `PATH` is refused (exit 2) and left as it was.
//! - A symbolic link is **written through**: the file it points to is the
//!   target, and the same rules apply to it (it must be a regular file, and
//!   it is replaced only with `--force`); the link itself is kept. A
//!   dangling link is refused, so qsim never creates a file at a place only
//!   a link names.
//! - An existing file is kept unless `--force` is given.
//! - The text goes to a temporary file in the target's directory, which is
//!   then renamed (with `--force`) or hard-linked (without: the link fails
//!   if a file appeared meanwhile, so nothing is ever clobbered) into place.
//!   On any failure the temporary file is removed and the target is untouched.
//! - A target that cannot be written (missing directory, no permission,
//!   read-only file system) is bad input: exit 2. A failure while writing
//!   (disk full, I/O error) is a runtime failure: exit 1.
//!
//! On stdout a write error (e.g. `qsim run > /dev/full`) is a runtime
//! failure (exit 1, with a message); a closed pipe (`qsim run | head -1`)
//! ends quietly with exit 0, as ripgrep does.
//!
//! [`check_target`] is called before a run starts, so a bad `--out` is
//! refused before minutes of simulation, and again when writing.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Why a report could not be written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OutputError {
    /// The `--out` target is unacceptable (exit 2): `flag` is `--out PATH`.
    BadTarget { flag: String, reason: String },
    /// Writing failed at run time (exit 1): `what` is `stdout` or `--out PATH`.
    Write { what: String, reason: String },
}

impl OutputError {
    pub fn exit_code(&self) -> i32 {
        match self {
            OutputError::BadTarget { .. } => 2,
            OutputError::Write { .. } => 1,
        }
    }
}

impl std::fmt::Display for OutputError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            OutputError::BadTarget { flag, reason } => write!(f, "{flag}: {reason}"),
            OutputError::Write { what, reason } => write!(f, "{what}: write failed: {reason}"),
        }
    }
}

impl std::error::Error for OutputError {}

fn bad(path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError::BadTarget {
        flag: format!("--out {}", path.display()),
        reason: reason.into(),
    }
}

/// The error text of an I/O error without Rust's " (os error N)" suffix.
fn io_reason(e: &io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// What kind of file system object a metadata describes, for messages.
fn kind_name(ft: &fs::FileType) -> &'static str {
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if ft.is_char_device() {
            return "a character device";
        }
        if ft.is_block_device() {
            return "a block device";
        }
        if ft.is_fifo() {
            return "a FIFO (named pipe)";
        }
        if ft.is_socket() {
            return "a socket";
        }
    }
    if ft.is_dir() {
        "a directory"
    } else if ft.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Check an `--out` target and return the path that will actually be
/// written (the file a symlink points to, else `path`). Refuses anything
/// but a regular file or a new name in an existing directory, and an
/// existing file without `force`.
pub fn check_target(path: &Path, force: bool) -> Result<PathBuf, OutputError> {
    if path.as_os_str().is_empty() {
        return Err(bad(path, "empty file name"));
    }
    let mut real = path.to_path_buf();
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => match fs::canonicalize(path) {
            Ok(t) => real = t,
            Err(_) => {
                return Err(bad(
                    path,
                    "is a symbolic link to nothing; qsim writes through a link only to an existing regular file",
                ))
            }
        },
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(path, format!("cannot inspect: {}", io_reason(&e)))),
    }
    let via = if real != path {
        format!(" (the symbolic link points to {})", real.display())
    } else {
        String::new()
    };
    match fs::metadata(&real) {
        Ok(m) if m.file_type().is_file() => {
            if !force {
                return Err(bad(
                    path,
                    format!("file exists{via}; pass --force to replace it"),
                ));
            }
        }
        Ok(m) => {
            return Err(bad(
                path,
                format!(
                    "is {}{via}; --out writes only regular files",
                    kind_name(&m.file_type())
                ),
            ))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(bad(path, format!("cannot inspect: {}", io_reason(&e)))),
    }
    if real.file_name().is_none() {
        return Err(bad(path, "names no file"));
    }
    let dir = parent_dir(&real);
    match fs::metadata(dir) {
        Ok(m) if m.is_dir() => Ok(real),
        Ok(_) => Err(bad(path, format!("{} is not a directory", dir.display()))),
        Err(e) => Err(bad(
            path,
            format!("directory {}: {}", dir.display(), io_reason(&e)),
        )),
    }
}

fn parent_dir(p: &Path) -> &Path {
    p.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Removes the temporary file unless disarmed.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_file(p);
        }
    }
}

/// Create a new temporary file next to `target`.
fn create_temp(path: &Path, target: &Path) -> Result<(File, PathBuf), OutputError> {
    let dir = parent_dir(target);
    let name = target
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qsim-out".into());
    for k in 0..100u32 {
        let tmp = dir.join(format!(".{name}.qsim-tmp-{}-{k}", std::process::id()));
        match OpenOptions::new().write(true).create_new(true).open(&tmp) {
            Ok(f) => return Ok((f, tmp)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(bad(
                    path,
                    format!(
                        "cannot create a file in {}: {}",
                        dir.display(),
                        io_reason(&e)
                    ),
                ))
            }
        }
    }
    Err(bad(
        path,
        format!("cannot find a free temporary name in {}", dir.display()),
    ))
}

/// Write `text` to the `--out` target atomically (see the module docs).
pub fn write_file(path: &Path, text: &str, force: bool) -> Result<(), OutputError> {
    let target = check_target(path, force)?;
    let (mut file, tmp) = create_temp(path, &target)?;
    // removes the temporary name on every return: after a failure, after a
    // hard link (the target keeps the data), and as a no-op after a rename
    let _guard = TempGuard(Some(tmp.clone()));
    let werr = |e: io::Error| OutputError::Write {
        what: format!("--out {}", path.display()),
        reason: io_reason(&e),
    };
    if force {
        // keep the permissions of the file being replaced (set before the
        // text is written, so it is never readable more widely)
        if let Ok(m) = fs::metadata(&target) {
            if m.is_file() {
                let _ = fs::set_permissions(&tmp, m.permissions());
            }
        }
    }
    file.write_all(text.as_bytes()).map_err(werr)?;
    file.sync_all().map_err(werr)?;
    drop(file);
    if force {
        // re-check right before the rename: only a regular file is replaced
        check_target(path, true)?;
        fs::rename(&tmp, &target).map_err(|e| bad(path, io_reason(&e)))?;
    } else {
        match fs::hard_link(&tmp, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(bad(
                    path,
                    "file exists (created while qsim ran); pass --force to replace it",
                ))
            }
            // file systems without hard links: check again, then rename
            Err(_) => {
                check_target(path, false)?;
                fs::rename(&tmp, &target).map_err(|e| bad(path, io_reason(&e)))?;
            }
        }
    }
    Ok(())
}

/// Write `text` to stdout and flush. A closed pipe is not an error.
pub fn write_stdout(text: &str) -> Result<(), OutputError> {
    let mut so = io::stdout().lock();
    match so.write_all(text.as_bytes()).and_then(|_| so.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(OutputError::Write {
            what: "stdout".into(),
            reason: io_reason(&e),
        }),
    }
}

/// Write the report to `--out` (if given) or stdout.
pub fn emit(text: &str, out: Option<&Path>, force: bool) -> Result<(), OutputError> {
    match out {
        None => write_stdout(text),
        Some(p) => write_file(p, text, force),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_file_then_refused_then_forced() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("r.txt");
        write_file(&p, "one", false).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "one");
        let e = write_file(&p, "two", false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--force"), "{e}");
        assert_eq!(fs::read_to_string(&p).unwrap(), "one");
        write_file(&p, "three", true).unwrap();
        assert_eq!(fs::read_to_string(&p).unwrap(), "three");
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 1, "no temp left");
    }

    #[test]
    fn directory_and_missing_parent_are_refused() {
        let d = tempfile::tempdir().unwrap();
        let e = write_file(d.path(), "x", true).unwrap_err();
        assert!(e.to_string().contains("a directory"), "{e}");
        let e = write_file(&d.path().join("no/such/r.txt"), "x", true).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
