//! Helpers shared by the live tests (proxy_live, proxy_redis, proxy_ops,
//! plan_enforce, replay_errors, replay_llmock, ...): the venv's binaries,
//! child processes killed on drop, llmock and `qsim proxy` started on ports
//! the kernel gives them (port 0, read back from what they print), free
//! loopback ports for servers that must keep theirs across a restart,
//! qsim run with a timeout, Python scripts, raw
//! HTTP/1.1 requests (JSON answers, chunked or not), the proxy's
//! `/metrics` and CSV files read as rows.

#![allow(dead_code)]

use serde_json::Value;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The live tests' Python environment (`QSIM_VENV`, default
/// `~/.cache/qsim-venv`).
fn venv() -> PathBuf {
    std::env::var_os("QSIM_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/qsim-venv")
        })
}

/// What a live test needs from outside the repository.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Part {
    /// The venv with llmock (upstream) and the openai SDK (client), and
    /// redis-server: `scripts/live-deps.sh`.
    Live,
    /// Chromium for the HTML report's browser test: `scripts/plot-deps.sh`.
    Browser,
    /// llama.cpp's `llama-server` and its random-weight model:
    /// `scripts/llama-deps.sh`.
    Engine,
}

/// llama.cpp's server and the model it serves, as `scripts/llama-deps.sh`
/// leaves them (`QSIM_LLAMA_CACHE`, default `~/.cache/qsim-llama`).
pub fn llama_paths() -> (PathBuf, PathBuf) {
    let c = std::env::var_os("QSIM_LLAMA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var_os("HOME").expect("HOME")).join(".cache/qsim-llama")
        });
    (c.join("bin/llama-server"), c.join("qsim-tiny-llama.gguf"))
}

fn on_path(cmd: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(cmd).is_file()))
}

/// Is `part` installed? If not: under the README's test command
/// (`scripts/test.sh` sets `QSIM_REQUIRE_LIVE=1`) the test fails, saying how
/// to install it; under a plain `cargo test` the test is skipped, and says
/// so on the terminal (written past libtest's capture, so it shows). Use
/// through [`live!`](crate::live).
pub fn ready(part: Part, module: &str) -> bool {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or(module);
    let (missing, how): (Vec<String>, &str) = match part {
        Part::Live => {
            let py = venv().join("bin").join("python");
            let mut m = Vec::new();
            let mods_ok = py.exists()
                && Command::new(&py)
                    .args(["-c", "import llmock, openai"])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success());
            if !mods_ok {
                m.push(format!("{} with llmock and openai", venv().display()));
            }
            if !on_path("redis-server") {
                m.push("redis-server".into());
            }
            (m, "scripts/live-deps.sh")
        }
        Part::Browser => {
            let c = std::env::var_os("QSIM_CHROMIUM")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/usr/bin/chromium"));
            let m = if c.exists() {
                vec![]
            } else {
                vec![c.display().to_string()]
            };
            (m, "scripts/plot-deps.sh")
        }
        Part::Engine => {
            let (server, model) = llama_paths();
            let m = [server, model]
                .into_iter()
                .filter(|p| !p.exists())
                .map(|p| p.display().to_string())
                .collect();
            (m, "scripts/llama-deps.sh")
        }
    };
    if missing.is_empty() {
        return true;
    }
    let msg = format!("{} missing: install with {how}", missing.join(", "));
    if std::env::var_os("QSIM_REQUIRE_LIVE").is_some_and(|v| v != "0") {
        panic!("{test}: {msg} (QSIM_REQUIRE_LIVE is set: the live tests are required)");
    }
    let _ = writeln!(std::io::stderr().lock(), "SKIPPED {test}: {msg}");
    false
}

/// At the top of a test that needs a live part (default [`Part::Live`]):
/// returns from the test, visibly, when the part is missing and not
/// required (see [`ready`]).
#[macro_export]
macro_rules! live {
    () => {
        $crate::live!(Live)
    };
    ($part:ident) => {
        if !$crate::common::ready($crate::common::Part::$part, module_path!()) {
            return;
        }
    };
}

pub fn venv_bin(name: &str) -> PathBuf {
    let p = venv().join("bin").join(name);
    assert!(
        p.exists(),
        "{} is missing: run scripts/live-deps.sh (scripts/test.sh does)",
        p.display()
    );
    p
}

/// A child process killed when dropped.
pub struct Proc(pub Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Stop a process with SIGTERM (a proxy drains and writes its log) and wait
/// for it (bounded).
pub fn stop(mut p: Proc) {
    let pid = p.0.id().to_string();
    assert!(Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap()
        .success());
    let t = Instant::now();
    while p.0.try_wait().unwrap().is_none() {
        assert!(t.elapsed() < Duration::from_secs(30), "proxy did not exit");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A loopback port free now, for a child process to listen on, where the
/// test must know the port before the child starts: a server restarted on
/// the same port (redis-server, a `qsim serve` upstream swapped under a
/// proxy) or a port nothing listens on. Servers that print the address
/// they got ([`llmock`], [`proxy`]) listen on port 0 instead.
///
/// Taken outside the kernel's ephemeral range (`ip_local_port_range`): a
/// port the kernel hands out for `bind(0)` or an outgoing connection could
/// be taken by another test's proxy (listening on port 0) before the child
/// binds it, and a readiness probe `connect` to a port in that range can
/// connect to itself (TCP simultaneous open, the source port chosen equal
/// to the destination) while nothing listens. One CI run lost a test to
/// that. The larger of 20000 up to the range's start and the range's end
/// up to 65535 is used. Each call of a test binary gets a different port
/// (a counter from a start the process id picks).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .unwrap_or_else(|_| "32768 60999".into());
    let mut it = range.split_whitespace().map(|x| x.parse::<u32>());
    let (Some(Ok(e_lo)), Some(Ok(e_hi))) = (it.next(), it.next()) else {
        panic!("ip_local_port_range reads {range:?}");
    };
    let below = (20_000, e_lo.max(20_000));
    let above = ((e_hi + 1).min(65_536), 65_536);
    let (lo, hi) = if below.1 - below.0 >= above.1 - above.0 {
        below
    } else {
        above
    };
    let span = hi - lo;
    assert!(
        span >= 100,
        "fewer than 100 ports outside ip_local_port_range {range:?} (from 20000)"
    );
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let k = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (lo + (start + k) % span) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free loopback port in {lo}..{hi}");
}

/// Start llmock with extra flags on a port the kernel gives it (`--port 0`)
/// and return once it listens: uvicorn's "Uvicorn running on URL" line (on
/// stderr, at `--log-level info`) is printed after the listening socket is
/// up and names the port it got.
///
/// No port is picked for llmock beforehand, so no other process can take it
/// between the pick and llmock's bind, and no readiness probe is needed
/// that could be answered by something other than llmock. (It used
/// [`free_port`] and a `connect` probe; one CI run in a few lost a test's
/// first request to llmock to a reset right after the probe passed.) If
/// llmock exits before listening, the panic shows what it printed.
pub fn llmock(extra: &[&str]) -> (Proc, String) {
    let mut child = Command::new(venv_bin("llmock"))
        .args([
            "serve",
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            "--log-level",
            "info",
            "--response-style",
            "static",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start llmock");
    let err = child.stderr.take().unwrap();
    let p = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    // reads stderr to its end (uvicorn logs there at info level), so that
    // llmock never blocks on a full pipe
    std::thread::spawn(move || {
        let mut lines = BufReader::new(err).lines().map_while(Result::ok);
        let mut before = String::new();
        let url = lines.find_map(|line| {
            let url = line
                .split_once("Uvicorn running on ")
                .and_then(|(_, rest)| rest.split_whitespace().next())
                .map(str::to_string);
            if url.is_none() {
                before.push_str(&line);
                before.push('\n');
            }
            url
        });
        let _ = tx.send(url.ok_or(before));
        lines.for_each(drop);
    });
    match rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(url)) => {
            assert!(
                url.starts_with("http://127.0.0.1:"),
                "llmock listens on {url}"
            );
            (p, url)
        }
        Ok(Err(log)) => panic!("llmock exited before listening; it printed:\n{log}"),
        Err(_) => panic!("llmock did not listen in 60 s"),
    }
}

/// The text of a proxy config: `[proxy]` gets `listen` and `upstream`.
pub fn proxy_config(upstream: &str, config: &str) -> String {
    format!(
        "kind = \"proxy\"\n[proxy]\nlisten = \"127.0.0.1:0\"\nupstream = \"{upstream}\"\n{config}"
    )
}

/// Start `qsim proxy` with this config body (see [`proxy_config`]); returns
/// its base URL. Its log (stderr) goes to `DIR/NAME.log`.
pub fn proxy(dir: &tempfile::TempDir, name: &str, upstream: &str, config: &str) -> (Proc, String) {
    let path = dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, proxy_config(upstream, config)).unwrap();
    let log = std::fs::File::create(dir.path().join(format!("{name}.log"))).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_qsim"))
        .args(["proxy", "--config"])
        .arg(&path)
        .arg("--threads")
        .arg("2")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("start qsim proxy");
    let mut p = Proc(child);
    let url = proxy_url(&mut p);
    (p, url)
}

/// The base URL a `qsim proxy` started with piped stdout listens on: its
/// first stdout line, printed once it listens (bounded wait). Started with
/// `listen = "127.0.0.1:0"`, it has a port no other process can hold.
pub fn proxy_url(p: &mut Proc) -> String {
    first_line_after(p, "qsim proxy: listening on ", "qsim proxy")
}

/// What follows `prefix` on the first stdout line of `p` (piped), read
/// within 20 s; `what` names the process in a failure.
pub fn first_line_after(p: &mut Proc, prefix: &str, what: &str) -> String {
    let out = p.0.stdout.take().expect("stdout is piped");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(out).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(20))
        .unwrap_or_else(|_| panic!("{what} did not start in 20 s"));
    line.trim()
        .strip_prefix(prefix)
        .unwrap_or_else(|| panic!("{what}: unexpected first line {line:?}"))
        .to_string()
}

/// Run a Python script (the venv's interpreter) with `PROXY` set; its last
/// stdout line is JSON.
pub fn python(script: &str, proxy: &str, timeout: Duration) -> Value {
    python_env(script, proxy, &[], timeout)
}

/// [`python`] with more environment variables.
pub fn python_env(script: &str, proxy: &str, env: &[(&str, &str)], timeout: Duration) -> Value {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(script.as_bytes()).unwrap();
    let mut child = Command::new(venv_bin("python"))
        .arg(f.path())
        .env("PROXY", proxy)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python");
    let deadline = Instant::now() + timeout;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("python script timed out after {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "python failed: {}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(stdout.lines().last().unwrap_or("")).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

/// One HTTP/1.1 request on a fresh connection: (status, headers, body).
pub fn http(
    url: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> (u16, String, String) {
    let hostport = url.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(hostport).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {hostport}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let _ = s.write_all(body);
    let mut resp = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut resp);
    let text = String::from_utf8_lossy(&resp).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The proxy's `/metrics` as (name{labels}, value) pairs.
pub fn metrics(url: &str) -> Vec<(String, f64)> {
    let (st, _, body) = http(url, "GET", "/metrics", &[], b"");
    assert_eq!(st, 200);
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

pub fn metric(m: &[(String, f64)], key: &str) -> f64 {
    m.iter().find(|(k, _)| k == key).map(|x| x.1).unwrap_or(0.0)
}

/// Wait (bounded) until nothing is in flight or reserved; return the metrics.
pub fn settled(url: &str) -> Vec<(String, f64)> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let m = metrics(url);
        if metric(&m, "qsim_proxy_in_flight") == 0.0
            && metric(&m, "qsim_proxy_reserved_tokens") == 0.0
        {
            return m;
        }
        assert!(
            Instant::now() < deadline,
            "reservations not returned after 10 s: {m:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Start `redis-server` (Debian package) on `port`, no persistence; wait
/// until it accepts.
pub fn redis_server(port: u16) -> Proc {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server is missing: run scripts/live-deps.sh (scripts/test.sh does)");
    let mut p = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(60);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Ok(Some(st)) = p.0.try_wait() {
            panic!("redis-server exited: {st}");
        }
        assert!(
            Instant::now() < deadline,
            "redis-server did not start in 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    p
}

/// One request straight to llmock: its first answer is slow (Python warming
/// up), which would shift the limiter's timeline of a test.
pub fn warm(up: &str) {
    let (st, _, _) = http(
        up,
        "POST",
        "/v1/chat/completions",
        &[("content-type", "application/json")],
        br#"{"model":"gpt-4o-mini","messages":[{"role":"user","content":"hi"}],"max_tokens":8}"#,
    );
    assert_eq!(st, 200);
}

/// One consumer `A` (key `key-a`), 60 requests per minute, no burst: one
/// admission per second, bucket depth 1.
pub const TIGHT: &str = r#"
[proxy.keys]
A = ["key-a"]

[deployment]
capacity = 60
threshold = 1.0
burst = 0
semantics = "rate-limit-only"

[[consumer]]
name = "A"
"#;

/// A CSV file as rows of (column → value).
pub fn read_csv(p: &Path) -> Vec<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut r = csv::Reader::from_reader(text.as_bytes());
    let h: Vec<String> = r.headers().unwrap().iter().map(String::from).collect();
    r.records()
        .map(|x| {
            h.iter()
                .cloned()
                .zip(x.unwrap().iter().map(String::from))
                .collect()
        })
        .collect()
}

/// Run qsim with extra environment variables, killed (and the test failed,
/// with its stderr) if it runs past `timeout`: (exit code, stdout, stderr).
/// The `qsim` binary under test as a command (working directory: the
/// repository root, as every test's relative paths assume). The one "run
/// qsim" helper: tests add arguments and `.output()` or `.spawn()` it.
pub fn qsim() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_qsim"));
    c.current_dir(env!("CARGO_MANIFEST_DIR"));
    c
}

pub fn qsim_env(args: &[&str], env: &[(&str, &str)], timeout: Duration) -> (i32, String, String) {
    let mut cmd = qsim();
    cmd.args(args).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("qsim");
    let deadline = Instant::now() + timeout;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "qsim {args:?} timed out after {timeout:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

/// The body of a `transfer-encoding: chunked` answer, joined.
pub fn dechunk(mut s: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = s.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).expect("hex chunk size");
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        s = &rest[n + 2..];
    }
    out
}

/// One HTTP/1.1 request without a body (llmock's admin API, a JSON
/// endpoint), read to the end with a 30 s timeout: (status, JSON body,
/// chunked or plain).
pub fn http_json(base: &str, method: &str, path: &str) -> (u16, Value) {
    let hostport = base.strip_prefix("http://").unwrap();
    let mut s = TcpStream::connect(hostport).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nhost: {hostport}\r\nconnection: close\r\ncontent-length: 0\r\n\r\n"
    )
    .unwrap();
    let mut raw = Vec::new();
    std::io::Read::read_to_end(&mut s, &mut raw).unwrap();
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").expect("HTTP answer");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|x| x.parse().ok())
        .unwrap_or(0);
    let body = if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        dechunk(body)
    } else {
        body.to_string()
    };
    let v = serde_json::from_str(&body)
        .unwrap_or_else(|e| panic!("{method} {path}: not JSON ({e}): {body}"));
    (status, v)
}

pub mod serve;
