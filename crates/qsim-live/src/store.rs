//! Where the limiter's `State` lives: in the process (default), or in a
//! Redis shared by several replicas.
//!
//! With Redis the rules are still decided by qsim-core's Rust code, never by
//! a script: a decision reads the serialized `State` (JSON text, one key),
//! runs `decide_pure` with this replica's `now`, and, when the state changed
//! (an admission), writes it back with a compare-and-set — a three-line Lua
//! script that SETs only if the stored text is still the one read, else
//! returns the current text so the decision is retried on it without another
//! round trip. Denials are decided on one read and write nothing.
//! Admissions and completions (`complete`) are written in batches: each
//! replica queues them and whoever holds the replica's writer turn applies
//! every queued operation in order to the state it read (the same
//! `decide_pure` / `complete` calls) and writes the result with one
//! compare-and-set (flat combining). Unbatched, concurrent compare-and-sets
//! mostly failed against each other: 221 forwarded req/s through 3
//! replicas; batched: 6,500–9,500 (benches/proxy.sh). The core's effective
//! time `max(now, state.clock)` makes replicas with slightly different
//! clocks safe (docs/limiter.md, "Shared state
//! across replicas").
//!
//! The client is a minimal RESP2 client on a tokio `TcpStream` (GET, EVAL),
//! about 100 lines instead of the `redis` crate: the proxy needs two
//! commands, and the crate's dependency tree (combine, futures, url, sha1, …)
//! would add to the 2-core build of every test run.
//!
//! Unreachable Redis (connect/IO error or timeout): the configured
//! [`FailMode`] applies — `Open` forwards without limiting, `Closed` answers
//! 503 — logged once on the transition; while down, a reconnection is tried
//! at most every 250 ms, and the first success is logged ("enforcement
//! resumes").

use qsim_core::limiter::admission::{
    complete, decide_pure, Decision, Grant, Params, Request, State,
};
use qsim_core::time::Nanos;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;

/// What a replica does while the shared state is unreachable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailMode {
    /// Forward every request unlimited (availability first).
    Open,
    /// Answer 503 to every request (the budget first).
    Closed,
}

impl FailMode {
    pub fn name(self) -> &'static str {
        match self {
            FailMode::Open => "open",
            FailMode::Closed => "closed",
        }
    }
}

/// Where the limiter state lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StateBackend {
    InProcess,
    /// `host:port` of a Redis server.
    Redis {
        addr: String,
        fail: FailMode,
    },
}

/// The CAS: set KEYS[1] to ARGV[2] iff it holds ARGV[1] ('' = absent);
/// returns 1, or the current text ('' when absent) to retry on.
const CAS: &str = "local c = redis.call('GET', KEYS[1]) or '' \
if c == ARGV[1] then redis.call('SET', KEYS[1], ARGV[2]) return 1 end \
return c";

/// A queued write and where its result goes.
type Pending = (Op, tokio::sync::oneshot::Sender<Result<Res, String>>);

const OP_TIMEOUT: Duration = Duration::from_millis(500);
const RETRY_DOWN: Duration = Duration::from_millis(250);
const MAX_CAS_TRIES: usize = 1000;
const POOL_MAX: usize = 256;

#[derive(Debug)]
enum Reply {
    Status,
    Int(i64),
    Bulk(Option<Vec<u8>>),
}

struct Conn {
    io: BufReader<TcpStream>,
}

impl Conn {
    async fn connect(addr: &str) -> Result<Conn, String> {
        let s = TcpStream::connect(addr)
            .await
            .map_err(|e| format!("connect {addr}: {e}"))?;
        let _ = s.set_nodelay(true);
        Ok(Conn {
            io: BufReader::new(s),
        })
    }

    async fn call(&mut self, args: &[&[u8]]) -> Result<Reply, String> {
        let mut out = Vec::with_capacity(64 + args.iter().map(|a| a.len() + 16).sum::<usize>());
        out.extend_from_slice(format!("*{}\r\n", args.len()).as_bytes());
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        self.io
            .get_mut()
            .write_all(&out)
            .await
            .map_err(|e| format!("write: {e}"))?;
        self.read().await
    }

    async fn line(&mut self) -> Result<String, String> {
        let mut l = String::new();
        let n = self
            .io
            .read_line(&mut l)
            .await
            .map_err(|e| format!("read: {e}"))?;
        if n == 0 || !l.ends_with("\r\n") {
            return Err("connection closed".into());
        }
        l.truncate(l.len() - 2);
        Ok(l)
    }

    async fn read(&mut self) -> Result<Reply, String> {
        let l = self.line().await?;
        let (kind, rest) = l.split_at(l.len().min(1));
        let int = |s: &str| s.parse::<i64>().map_err(|_| format!("bad reply {l:?}"));
        match kind {
            "+" => Ok(Reply::Status),
            "-" => Err(format!("redis error: {rest}")),
            ":" => Ok(Reply::Int(int(rest)?)),
            "$" => {
                let n = int(rest)?;
                if n < 0 {
                    return Ok(Reply::Bulk(None));
                }
                let mut b = vec![0u8; n as usize + 2];
                self.io
                    .read_exact(&mut b)
                    .await
                    .map_err(|e| format!("read: {e}"))?;
                b.truncate(n as usize);
                Ok(Reply::Bulk(Some(b)))
            }
            _ => Err(format!("unexpected reply {l:?}")),
        }
    }
}

/// The limiter state in Redis under one key, shared by every replica whose
/// limiter configuration is the same (the key names a hash of it).
pub struct RedisState {
    addr: String,
    pub key: String,
    pub fail: FailMode,
    pool: Mutex<Vec<Conn>>,
    writer: tokio::sync::Mutex<()>,
    queue: Mutex<Vec<Pending>>,
    up: AtomicBool,
    next_try: Mutex<Option<Instant>>,
}

/// FNV-1a, 64 bits: the key of a limiter configuration.
fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

impl RedisState {
    /// `lease`: the configured concurrency lease (part of the key).
    pub fn new(addr: String, fail: FailMode, p: &Params, lease: Option<Nanos>) -> RedisState {
        let ident = format!(
            "{}|lease={lease:?}",
            serde_json::to_string(p.config()).unwrap_or_default(),
        );
        RedisState {
            addr,
            key: format!("qsim:limiter:{:016x}", fnv(ident.as_bytes())),
            fail,
            pool: Mutex::new(Vec::new()),
            writer: tokio::sync::Mutex::new(()),
            queue: Mutex::new(Vec::new()),
            up: AtomicBool::new(true),
            next_try: Mutex::new(None),
        }
    }

    /// One exchange on a pooled connection (a new one if none is idle, or
    /// if the pooled one turns out dead: Redis restarted since).
    async fn call(&self, args: &[&[u8]]) -> Result<Reply, String> {
        let pooled = self.pool.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let fut = async {
            if let Some(mut c) = pooled {
                match c.call(args).await {
                    Ok(r) => return Ok((c, r)),
                    Err(e) if e.starts_with("redis error") => return Err(e),
                    Err(_) => {}
                }
            }
            let mut c = Conn::connect(&self.addr).await?;
            let r = c.call(args).await?;
            Ok::<_, String>((c, r))
        };
        let (c, r) = tokio::time::timeout(OP_TIMEOUT, fut).await.map_err(|_| {
            format!(
                "redis at {} did not answer within {OP_TIMEOUT:?}",
                self.addr
            )
        })??;
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.len() < POOL_MAX {
            pool.push(c);
        }
        Ok(r)
    }

    /// While down, fail fast until the next reconnection attempt is due.
    fn skip(&self) -> bool {
        if self.up.load(Ordering::Relaxed) {
            return false;
        }
        let mut n = self.next_try.lock().unwrap_or_else(|e| e.into_inner());
        match *n {
            Some(t) if Instant::now() < t => true,
            _ => {
                *n = Some(Instant::now() + RETRY_DOWN);
                false
            }
        }
    }

    fn went_down(&self, e: &str) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).clear();
        *self.next_try.lock().unwrap_or_else(|e| e.into_inner()) =
            Some(Instant::now() + RETRY_DOWN);
        if self.up.swap(false, Ordering::Relaxed) {
            tracing::error!(
                error = %e,
                fail_mode = self.fail.name(),
                "shared limiter state unreachable: failing {}",
                self.fail.name()
            );
        }
    }

    fn went_up(&self) {
        if !self.up.swap(true, Ordering::Relaxed) {
            tracing::info!(addr = %self.addr, key = %self.key, "shared limiter state reachable again: enforcement resumes");
        }
    }

    async fn get(&self) -> Result<Option<Vec<u8>>, String> {
        match self.call(&[b"GET", self.key.as_bytes()]).await? {
            Reply::Bulk(b) => Ok(b),
            r => Err(format!("GET: unexpected reply {r:?}")),
        }
    }

    /// Compare-and-set: `Ok(None)` = written, `Ok(Some(current))` = lost the race.
    async fn cas(&self, expected: &[u8], new: &[u8]) -> Result<Option<Vec<u8>>, String> {
        match self
            .call(&[
                b"EVAL",
                CAS.as_bytes(),
                b"1",
                self.key.as_bytes(),
                expected,
                new,
            ])
            .await?
        {
            Reply::Int(1) => Ok(None),
            Reply::Bulk(Some(b)) => Ok(Some(b)),
            r => Err(format!("CAS: unexpected reply {r:?}")),
        }
    }

    fn parse(p: &Params, cur: &Option<Vec<u8>>, t: Nanos) -> Result<State, String> {
        match cur {
            Some(b) if !b.is_empty() => serde_json::from_slice::<State>(b)
                .map_err(|e| format!("stored state unreadable: {e}")),
            _ => Ok(State::new(p, t)),
        }
    }

    fn health<T>(&self, r: &Result<T, String>) {
        match r {
            Ok(_) => self.went_up(),
            Err(e) => self.went_down(e),
        }
    }

    /// Apply a batch of operations in order to the current state, one
    /// compare-and-set for all of them, retried on conflicts.
    async fn commit(
        &self,
        p: &Params,
        now: &(dyn Fn() -> Nanos + Sync),
        ops: &[Op],
    ) -> Result<Vec<Res>, String> {
        let mut cur = self.get().await?;
        for _ in 0..MAX_CAS_TRIES {
            let t0 = now();
            let mut state = Self::parse(p, &cur, t0)?;
            let mut changed = false;
            let mut out = Vec::with_capacity(ops.len());
            for op in ops {
                let t = now();
                match op {
                    Op::Decide(req) => {
                        let (d, next) = decide_pure(p, &state, t, req);
                        if let Some(n) = next {
                            state = n;
                            changed = true;
                        }
                        out.push(Res::Decided(d, t));
                    }
                    Op::Complete(g, output) => {
                        let before = state.clone();
                        complete(p, &mut state, t, g, *output);
                        changed |= state != before;
                        out.push(Res::Done);
                    }
                }
            }
            if !changed {
                return Ok(out);
            }
            let text = serde_json::to_vec(&state).map_err(|e| e.to_string())?;
            match self.cas(cur.as_deref().unwrap_or(b""), &text).await? {
                None => return Ok(out),
                Some(c) => cur = Some(c),
            }
        }
        Err(format!(
            "{MAX_CAS_TRIES} compare-and-set conflicts in a row"
        ))
    }

    /// Queue `op` for the next batch; whoever holds the writer's turn
    /// commits every queued operation at once (flat combining: one
    /// read-modify-write per batch instead of one per request, so the
    /// replicas' compare-and-sets rarely meet).
    async fn submit(
        &self,
        p: &Params,
        now: &(dyn Fn() -> Nanos + Sync),
        op: Op,
    ) -> Result<Res, String> {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        self.queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((op, tx));
        loop {
            tokio::select! {
                biased;
                r = &mut rx => return r.unwrap_or_else(|_| Err("batch abandoned".into())),
                turn = self.writer.lock() => {
                    let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(|e| e.into_inner()));
                    if batch.is_empty() {
                        continue;
                    }
                    let (ops, txs): (Vec<Op>, Vec<_>) = batch.into_iter().unzip();
                    let r = if self.skip() {
                        Err("down (retrying every 250 ms)".to_string())
                    } else {
                        let r = self.commit(p, now, &ops).await;
                        self.health(&r);
                        r
                    };
                    // answer before giving up the turn: whoever takes it
                    // next finds its own answer ready if it was in this batch
                    match r {
                        Ok(res) => {
                            for (tx, x) in txs.into_iter().zip(res) {
                                let _ = tx.send(Ok(x));
                            }
                        }
                        Err(e) => {
                            for tx in txs {
                                let _ = tx.send(Err(e.clone()));
                            }
                        }
                    }
                    drop(turn);
                }
            }
        }
    }

    /// `decide` on the shared state: a denial is decided on one read (no
    /// write, no waiting); an admission is committed in the next batch
    /// (decided again there, on the state it is written to).
    pub async fn decide(
        &self,
        p: &Params,
        now: &(dyn Fn() -> Nanos + Sync),
        req: &Request,
    ) -> Result<(Decision, Nanos), String> {
        if self.skip() {
            return Err("down (retrying every 250 ms)".into());
        }
        let first = async {
            let cur = self.get().await?;
            let t = now();
            let s = Self::parse(p, &cur, t)?;
            Ok::<_, String>((decide_pure(p, &s, t, req), t))
        }
        .await;
        self.health(&first);
        match first? {
            ((d, None), t) => Ok((d, t)),
            ((_, Some(_)), _) => match self.submit(p, now, Op::Decide(*req)).await? {
                Res::Decided(d, t) => Ok((d, t)),
                Res::Done => Err("internal: a decision answered as a completion".into()),
            },
        }
    }

    /// The shared state as of now (read only; a waiting request's prediction).
    pub async fn snapshot(&self, p: &Params, now: Nanos) -> Result<State, String> {
        if self.skip() {
            return Err("down (retrying every 250 ms)".into());
        }
        let cur = self.get().await;
        self.health(&cur);
        Self::parse(p, &cur?, now)
    }

    /// `complete` on the shared state (batched with other writes).
    pub async fn complete(
        &self,
        p: &Params,
        now: &(dyn Fn() -> Nanos + Sync),
        grant: &Grant,
        output: u64,
    ) -> Result<(), String> {
        self.submit(p, now, Op::Complete(*grant, output))
            .await
            .map(|_| ())
    }
}

/// A write to the shared state, queued for the next batch.
enum Op {
    Decide(Request),
    Complete(Grant, u64),
}

enum Res {
    Decided(Decision, Nanos),
    Done,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv_is_stable() {
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_ne!(fnv(b"a"), fnv(b"b"));
    }
}
