//! Writing a report: to stdout, or to the regular file named by `--out`;
//! and writing a results directory (`--out DIR`).
//!
//! `--out PATH` names a **directory** when PATH ends with `/` or its last
//! component has no extension (`results`, `out/sweep-1`), and a **report
//! file** otherwise (`report.txt`, `all.csv`): the command line alone
//! decides, never what happens to be on disk, so the same command always
//! means the same thing ([`is_dir_target`]).
//!
//! Rules for `--out FILE` (the README's "Output and exit codes" states them
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
//!
//! Rules for `--out DIR` ([`check_dir`], [`write_dir`]):
//!
//! - A new name (in an existing directory) or an empty directory is
//!   written. A non-empty directory is refused (exit 2, nothing written)
//!   unless `--force` is given, and even then it is replaced only if it
//!   holds nothing but regular files with the names this command writes
//!   (a previous output of the same kind): `--force` never deletes anything
//!   qsim did not write.
//! - A symbolic link, regular file, device, FIFO or socket at DIR is
//!   refused (exit 2) and left as it was; links are not followed.
//! - The files go to a temporary directory next to DIR, each synced, which
//!   is then renamed to DIR (rename(2) replaces only a missing name or an
//!   empty directory, so nothing created meanwhile is clobbered). With
//!   `--force` the old directory is first renamed aside, the new one renamed
//!   in, and the old one deleted: a reader sees the old directory, briefly
//!   no directory, then the new one, never a partial one. On any failure
//!   the temporary directory is removed and DIR is as it was.

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

fn bad_flag(flag: &str, path: &Path, reason: impl Into<String>) -> OutputError {
    OutputError::BadTarget {
        flag: format!("{flag} {}", path.display()),
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
    check_target_as("--out", path, force)
}

/// [`check_target`] for the flag that gave the path (`--html`,
/// `--emit-proxy-config`): errors name it.
pub fn check_target_as(flag: &str, path: &Path, force: bool) -> Result<PathBuf, OutputError> {
    let bad = |path: &Path, r: String| bad_flag(flag, path, r);
    if path.as_os_str().is_empty() {
        return Err(bad(path, "empty file name".to_string()));
    }
    let mut real = path.to_path_buf();
    match fs::symlink_metadata(path) {
        Ok(m) if m.file_type().is_symlink() => match fs::canonicalize(path) {
            Ok(t) => real = t,
            Err(_) => {
                return Err(bad(path, "is a symbolic link to nothing; qsim writes through a link only to an existing regular file".to_string()))
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
        return Err(bad(path, "names no file".to_string()));
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
fn create_temp(flag: &str, path: &Path, target: &Path) -> Result<(File, PathBuf), OutputError> {
    let bad = |path: &Path, r: String| bad_flag(flag, path, r);
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
    write_file_as("--out", path, text, force)
}

/// [`write_file`] for the flag that gave the path: errors name it.
pub fn write_file_as(flag: &str, path: &Path, text: &str, force: bool) -> Result<(), OutputError> {
    let bad = |path: &Path, r: String| bad_flag(flag, path, r);
    let target = check_target_as(flag, path, force)?;
    let (mut file, tmp) = create_temp(flag, path, &target)?;
    // removes the temporary name on every return: after a failure, after a
    // hard link (the target keeps the data), and as a no-op after a rename
    let _guard = TempGuard(Some(tmp.clone()));
    let werr = |e: io::Error| OutputError::Write {
        what: format!("{flag} {}", path.display()),
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
        check_target_as(flag, path, true)?;
        fs::rename(&tmp, &target).map_err(|e| bad(path, io_reason(&e)))?;
    } else {
        match fs::hard_link(&tmp, &target) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(bad(
                    path,
                    "file exists (created while qsim ran); pass --force to replace it".to_string(),
                ))
            }
            // file systems without hard links: check again, then rename
            Err(_) => {
                check_target_as(flag, path, false)?;
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

/// Whether `--out PATH` names a results directory rather than a report
/// file: PATH ends with `/`, or its last component has no extension.
pub fn is_dir_target(path: &Path) -> bool {
    path.as_os_str().to_string_lossy().ends_with('/') || path.extension().is_none()
}

/// What [`write_dir`] will do with the target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirTarget {
    /// Nothing there yet: the new directory is renamed to the name.
    New,
    /// An empty directory: replaced by the new one.
    Empty,
    /// A directory of this command's own output files (`--force`).
    Replace,
}

/// Check a results-directory target (`flag` is `--out`): see the module
/// docs. `names` are the files the command writes; with `force`, an
/// existing directory holding only such files may be replaced.
pub fn check_dir(
    flag: &str,
    path: &Path,
    names: &[&str],
    force: bool,
) -> Result<DirTarget, OutputError> {
    let bad = |r: String| bad_flag(flag, path, r);
    if path.as_os_str().is_empty() {
        return Err(bad("empty directory name".into()));
    }
    let m = match fs::symlink_metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            if path.file_name().is_none() {
                return Err(bad("names no directory".into()));
            }
            let dir = parent_dir(path);
            return match fs::metadata(dir) {
                Ok(m) if m.is_dir() => Ok(DirTarget::New),
                Ok(_) => Err(bad(format!("{} is not a directory", dir.display()))),
                Err(e) => Err(bad(format!(
                    "directory {}: {}",
                    dir.display(),
                    io_reason(&e)
                ))),
            };
        }
        Err(e) => return Err(bad(format!("cannot inspect: {}", io_reason(&e)))),
    };
    let ft = m.file_type();
    if ft.is_symlink() {
        return Err(bad(format!(
            "is a symbolic link; {flag} DIR does not follow links (name the directory itself)"
        )));
    }
    if ft.is_file() {
        return Err(bad(format!(
            "is a regular file; {flag} DIR writes a directory (a name with an extension, \
             e.g. report.txt, writes the report to a file)"
        )));
    }
    if !ft.is_dir() {
        return Err(bad(format!(
            "is {}; {flag} DIR writes a directory",
            kind_name(&ft)
        )));
    }
    let entries = fs::read_dir(path).map_err(|e| bad(format!("cannot list: {}", io_reason(&e))))?;
    let mut found: Vec<(String, bool)> = Vec::new();
    for e in entries {
        let e = e.map_err(|e| bad(format!("cannot list: {}", io_reason(&e))))?;
        let regular = e.file_type().is_ok_and(|t| t.is_file());
        found.push((e.file_name().to_string_lossy().into_owned(), regular));
    }
    found.sort();
    if found.is_empty() {
        return Ok(DirTarget::Empty);
    }
    if !force {
        return Err(bad(
            "directory exists and is not empty; pass --force to replace an output directory qsim wrote"
                .into(),
        ));
    }
    if let Some((n, _)) = found
        .iter()
        .find(|(n, regular)| !regular || !names.contains(&n.as_str()))
    {
        return Err(bad(format!(
            "holds {n}, which this command does not write; --force replaces only a directory of qsim's own output files ({})",
            names.join(", ")
        )));
    }
    Ok(DirTarget::Replace)
}

/// Removes a temporary directory (and its files) unless disarmed.
struct TempDirGuard(Option<PathBuf>);

impl Drop for TempDirGuard {
    fn drop(&mut self) {
        if let Some(p) = self.0.take() {
            let _ = fs::remove_dir_all(p);
        }
    }
}

/// A new directory `.NAME.qsim-WHAT-PID-K` next to `target`.
fn sibling_name(target: &Path, what: &str, k: u32) -> PathBuf {
    let name = target
        .file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "qsim-out".into());
    parent_dir(target).join(format!(".{name}.qsim-{what}-{}-{k}", std::process::id()))
}

/// Write `files` (name, bytes) as the directory `path` atomically (see
/// the module docs); `flag` names the option in errors (`--out`).
pub fn write_dir(
    flag: &str,
    path: &Path,
    files: &[(String, Vec<u8>)],
    force: bool,
) -> Result<(), OutputError> {
    let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
    check_dir(flag, path, &names, force)?;
    let bad = |r: String| bad_flag(flag, path, r);
    let mut tmp = None;
    for k in 0..100u32 {
        let t = sibling_name(path, "tmp", k);
        match fs::create_dir(&t) {
            Ok(()) => {
                tmp = Some(t);
                break;
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(bad(format!(
                    "cannot create a directory in {}: {}",
                    parent_dir(path).display(),
                    io_reason(&e)
                )))
            }
        }
    }
    let tmp = tmp.ok_or_else(|| bad("cannot find a free temporary name".into()))?;
    let _guard = TempDirGuard(Some(tmp.clone()));
    for (name, bytes) in files {
        let werr = |e: io::Error| OutputError::Write {
            what: format!("{flag} {}", path.join(name).display()),
            reason: io_reason(&e),
        };
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp.join(name))
            .map_err(werr)?;
        f.write_all(bytes).map_err(werr)?;
        f.sync_all().map_err(werr)?;
    }
    if let Ok(d) = File::open(&tmp) {
        let _ = d.sync_all();
    }
    // re-check right before the rename: what is there now decides
    let target = check_dir(flag, path, &names, force)?;
    let raced = |e: &io::Error| {
        bad(format!(
            "{} (it changed while qsim ran); nothing written",
            io_reason(e)
        ))
    };
    if target == DirTarget::Replace {
        let mut old = None;
        for k in 0..100u32 {
            let o = sibling_name(path, "old", k);
            if fs::symlink_metadata(&o).is_err() {
                old = Some(o);
                break;
            }
        }
        let old = old.ok_or_else(|| bad("cannot find a free temporary name".into()))?;
        fs::rename(path, &old).map_err(|e| raced(&e))?;
        if let Err(e) = fs::rename(&tmp, path) {
            let _ = fs::rename(&old, path);
            return Err(raced(&e));
        }
        let _ = fs::remove_dir_all(&old);
    } else {
        fs::rename(&tmp, path).map_err(|e| raced(&e))?;
    }
    Ok(())
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

    fn files() -> Vec<(String, Vec<u8>)> {
        vec![
            ("a.csv".to_string(), b"x\n".to_vec()),
            ("manifest.json".to_string(), b"{}\n".to_vec()),
        ]
    }

    fn listing(d: &Path) -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn dir_targets_are_told_from_file_targets_by_the_name() {
        for d in ["results", "out/sweep-1", "x.d/", "/dev/null", "."] {
            assert!(is_dir_target(Path::new(d)), "{d}");
        }
        for f in ["r.txt", "out/all.csv", "x.d"] {
            assert!(!is_dir_target(Path::new(f)), "{f}");
        }
    }

    #[test]
    fn dir_new_empty_nonempty_and_forced() {
        let d = tempfile::tempdir().unwrap();
        let out = d.path().join("res");
        write_dir("--out", &out, &files(), false).unwrap();
        assert_eq!(listing(&out), ["a.csv", "manifest.json"]);
        // non-empty: refused without --force, kept
        let e = write_dir("--out", &out, &[("a.csv".into(), b"y".to_vec())], false).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("not empty"), "{e}");
        assert_eq!(fs::read(out.join("a.csv")).unwrap(), b"x\n");
        // --force replaces a directory of the same files
        let mut newer = files();
        newer[0].1 = b"z\n".to_vec();
        write_dir("--out", &out, &newer, true).unwrap();
        assert_eq!(listing(&out), ["a.csv", "manifest.json"]);
        assert_eq!(fs::read(out.join("a.csv")).unwrap(), b"z\n");
        // a directory with a file this write would not produce is kept
        let e = write_dir("--out", &out, &files()[..1], true).unwrap_err();
        assert!(e.to_string().contains("holds manifest.json"), "{e}");
        // but not one holding anything else
        fs::write(out.join("notes.txt"), "mine").unwrap();
        let e = write_dir("--out", &out, &files(), true).unwrap_err();
        assert!(e.to_string().contains("holds notes.txt"), "{e}");
        assert_eq!(listing(&out), ["a.csv", "manifest.json", "notes.txt"]);
        // an empty directory is filled
        let empty = d.path().join("empty");
        fs::create_dir(&empty).unwrap();
        write_dir("--out", &empty, &files(), false).unwrap();
        assert_eq!(listing(&empty), ["a.csv", "manifest.json"]);
        assert_eq!(listing(d.path()), ["empty", "res"], "no temporary left");
    }

    #[test]
    fn dir_refuses_files_links_and_missing_parents() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("plain");
        fs::write(&f, "keep").unwrap();
        let e = write_dir("--out", &f, &files(), true).unwrap_err();
        assert!(e.to_string().contains("regular file"), "{e}");
        let l = d.path().join("link");
        std::os::unix::fs::symlink(d.path(), &l).unwrap();
        let e = write_dir("--out", &l, &files(), true).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        let e = write_dir("--out", &d.path().join("no/such"), &files(), true).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert_eq!(listing(d.path()), ["link", "plain"]);
        assert_eq!(fs::read_to_string(&f).unwrap(), "keep");
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
