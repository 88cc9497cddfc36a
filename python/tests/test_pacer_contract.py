"""The Pacer's contract in real time: concurrency bounds counted by a fake
endpoint, the shared retry quota, bad input, closing, Ctrl-C, exceptions.
Verdicts rest on counts, never on how fast this machine is."""

import asyncio
import os
import signal
import threading
import time

import pytest

import qsim


class Endpoint:
    """A fake endpoint that counts calls in flight (its own view)."""

    def __init__(self, hold=0.002, fail=None):
        self.lock = threading.Lock()
        self.inflight = 0
        self.max_inflight = 0
        self.calls = 0
        self.hold = hold
        self.fail = fail  # calls -> exception to raise, or None

    def enter(self):
        with self.lock:
            self.inflight += 1
            self.calls += 1
            n = self.calls
            self.max_inflight = max(self.max_inflight, self.inflight)
        return n

    def leave(self):
        with self.lock:
            self.inflight -= 1

    def __call__(self, row):
        n = self.enter()
        try:
            time.sleep(self.hold)
            if self.fail is not None:
                e = self.fail(n, row)
                if e is not None:
                    raise e
            return {"row": row}
        finally:
            self.leave()

    async def acall(self, row):
        n = self.enter()
        try:
            await asyncio.sleep(self.hold)
            if self.fail is not None:
                e = self.fail(n, row)
                if e is not None:
                    raise e
            return {"row": row}
        finally:
            self.leave()


class Status(Exception):
    def __init__(self, status, headers=None):
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.headers = headers or {}


def test_64_threads_never_exceed_workers():
    ep = Endpoint()
    p = qsim.Pacer(workers=5, retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 3})
    # every 3rd row's first attempt is a 503: its retry holds the worker through the sleep
    seen = set()
    ep.fail = lambda n, row: Status(503) if row % 3 == 0 and not (row in seen or seen.add(row)) else None
    out = [None] * 64 * 4

    def thread(t):
        for k in range(4):
            out[t * 4 + k] = p.call(ep, t * 4 + k)

    ths = [threading.Thread(target=thread, args=(t,)) for t in range(64)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    assert ep.max_inflight <= 5
    assert ep.max_inflight == 5, "64 threads keep every worker busy"
    assert all(o == {"row": i} for i, o in enumerate(out))
    c = p.counts()
    assert c["rows"] == 256 and c["attempts"] == ep.calls


def test_64_asyncio_tasks_never_exceed_workers():
    ep = Endpoint()
    p = qsim.Pacer(workers=7, retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 3})
    seen = set()
    ep.fail = lambda n, row: Status(429) if row % 4 == 0 and not (row in seen or seen.add(row)) else None

    async def main():
        return await asyncio.gather(*(p.acall(ep.acall, i) for i in range(64 * 3)))

    out = asyncio.run(main())
    assert ep.max_inflight <= 7
    assert ep.max_inflight == 7
    assert out == [{"row": i} for i in range(64 * 3)]


def test_threads_and_tasks_share_one_pool():
    ep = Endpoint(hold=0.003)
    p = qsim.Pacer(workers=4)

    async def tasks():
        return await asyncio.gather(*(p.acall(ep.acall, i) for i in range(40)))

    ths = [threading.Thread(target=lambda: [p.call(ep, i) for i in range(5)]) for _ in range(16)]
    for th in ths:
        th.start()
    asyncio.run(tasks())
    for th in ths:
        th.join()
    assert ep.max_inflight <= 4


def test_a_shared_retry_quota_is_never_overdrawn():
    """Every answer a 503, no refunds: 64 threads together get exactly
    capacity // cost retries, never one more."""
    ep = Endpoint(hold=0.0005, fail=lambda n, row: Status(503))
    cap, cost = 37, 5
    p = qsim.Pacer(
        workers=16,
        retry={"backoff": "constant", "delay_s": 0.0005, "max_attempts": 50},
        retry_quota={"capacity": cap, "cost": cost, "success_increment": 0},
    )
    failed = []

    def thread(t):
        for k in range(2):
            try:
                p.call(ep, t * 2 + k)
            except Status:
                failed.append(t)

    ths = [threading.Thread(target=thread, args=(t,)) for t in range(64)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    rows = 128
    assert len(failed) == rows
    retries = ep.calls - rows
    assert retries == cap // cost, f"{retries} retries paid from a quota of {cap} at {cost} each"
    assert p.quota_level() == cap - (cap // cost) * cost
    log = p.rows()
    assert sum(log["attempts"]) == ep.calls


def test_a_quota_with_refunds_accounts_for_every_retry():
    """Retried successes give their cost back (no refund for a first-try
    success): then the final level is exactly capacity − cost × retries
    paid + cost × retried rows that succeeded, counted from the log, and
    never below zero (an overdraft would need a negative level)."""
    import random

    rnd = random.Random(5)
    lock = threading.Lock()

    def fail(n, row):
        with lock:
            return Status(503) if rnd.random() < 0.6 else None

    ep = Endpoint(hold=0.0005, fail=fail)
    cap, cost = 30, 5
    p = qsim.Pacer(
        workers=12,
        retry={"backoff": "constant", "delay_s": 0.0005, "max_attempts": 6},
        retry_quota={"capacity": cap, "cost": cost, "success_increment": 0},
    )

    def thread(t):
        for k in range(3):
            try:
                p.call(ep, t)
            except Status:
                pass

    ths = [threading.Thread(target=thread, args=(t,)) for t in range(64)]
    for th in ths:
        th.start()
    for th in ths:
        th.join()
    log, rows = p.attempts(), p.rows()
    assert sum(rows["attempts"]) == ep.calls == len(log["row"])
    paid = sum(1 for a in log["attempt"] if a > 1)
    refunded = sum(1 for s, n in zip(rows["status"], rows["attempts"]) if s == 200 and n > 1)
    assert paid > cap // cost, "refunds let more retries through than the bare capacity"
    assert p.quota_level() == cap - cost * paid + cost * refunded >= 0


def test_an_unknown_exception_is_a_failed_attempt_not_a_crash():
    class Weird(Exception):
        pass

    calls = []

    def fn():
        calls.append(1)
        if len(calls) < 3:
            raise Weird("boom")
        return "ok"

    p = qsim.Pacer(retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 3, "retry_on": ["5xx"]})
    assert p.call(fn) == "ok"
    log = p.attempts()
    assert log["error_kind"][:2] == ["exception", "exception"]
    assert log["status"][:2] == [None, None]
    assert log["error"][0] == "Weird: boom"
    # not retried when 5xx is not: the exception itself comes back
    q = qsim.Pacer(retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 3, "retry_on": ["429"]})
    with pytest.raises(Weird):
        q.call(lambda: (_ for _ in ()).throw(Weird("x")))


def test_invalid_policies_raise_naming_the_field():
    with pytest.raises(qsim.ConfigError) as e:
        qsim.Pacer(retry={"backoff": "exponential", "max_attempts": 0})
    assert str(e.value) == "policy: retry.max_attempts: must be in 1..=1000, got 0"
    assert (e.value.source, e.value.field) == ("policy", "retry.max_attempts")
    with pytest.raises(qsim.ConfigError, match=r"^policy: retry.backoff: unknown backoff \"jitter\""):
        qsim.Pacer(retry={"backoff": "jitter"})
    with pytest.raises(qsim.ConfigError, match="unknown field `retyr`"):
        qsim.Pacer(retyr={"backoff": "none"})
    with pytest.raises(qsim.ConfigError, match=r"^policy: workers: must be > 0, got 0"):
        qsim.Pacer(workers=0)
    with pytest.raises(qsim.ConfigError, match=r"^policy: throttle.k: must be >= 1"):
        qsim.Pacer(throttle={"k": 0.5})
    with pytest.raises(qsim.ConfigError, match=r"^policy: policy: unknown policy \"fast\""):
        qsim.Pacer(policy="fast")
    with pytest.raises(qsim.ConfigError, match=r"^time_scale: must be > 0"):
        qsim.Pacer(time_scale=0)
    assert issubclass(qsim.ConfigError, qsim.QsimError)


def test_experiment_files_and_overrides():
    p = qsim.Pacer.from_experiment("builtin:experiments/fmapi-pacing.toml", "exp2-backoff", set=["workers=10"])
    assert (p.workers, p.client, p.sdk_retries) == (10, "pool", True)
    m = qsim.Pacer.from_experiment("builtin:experiments/fmapi-pacing.toml", "exp3-ai-query")
    assert m.client == "managed" and m.workers == 64
    with pytest.raises(qsim.ConfigError, match="has 3 experiments: name one"):
        qsim.Pacer.from_experiment("builtin:experiments/fmapi-pacing.toml")
    with pytest.raises(qsim.ConfigError, match=r"experiment.exp2-backoff.retry.max_attempts"):
        qsim.Pacer.from_experiment(
            "builtin:experiments/fmapi-pacing.toml", "exp2-backoff", set=["experiment.1.retry.max_attempts=0"]
        )


def test_the_sdk_must_not_retry_on_its_own():
    openai = pytest.importorskip("openai")
    c = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1")
    p = qsim.Pacer(workers=1)
    with pytest.raises(qsim.ConfigError, match="max_retries = 2"):
        p.call(c.chat.completions.create, model="m", messages=[])
    # with max_retries=0 it is sent (and fails to connect: a failed exchange)
    c0 = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9/v1", max_retries=0, timeout=2)
    with pytest.raises(openai.APIConnectionError):
        p.call(c0.chat.completions.create, model="m", messages=[{"role": "user", "content": "hi"}])
    assert p.attempts()["error_kind"] == ["connect"]


def test_a_closed_pacer_raises_and_cancels_waits_at_once():
    p = qsim.Pacer(workers=1, retry={"backoff": "constant", "delay_s": 30, "max_attempts": 3})
    errors = []

    def slow():
        try:
            p.call(lambda: (_ for _ in ()).throw(Status(503)))
        except BaseException as e:
            errors.append(e)

    th = threading.Thread(target=slow)
    th.start()
    waiting = []

    def queued():
        try:
            p.call(lambda: 1)
        except BaseException as e:
            waiting.append(e)

    t2 = threading.Thread(target=queued)
    t2.start()
    # the first call sleeps 30 s between attempts; the second waits for its worker
    deadline = time.monotonic() + 10
    while p.counts()["attempts"] < 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    t0 = time.process_time()
    p.close()
    th.join(5)
    t2.join(5)
    assert not th.is_alive() and not t2.is_alive(), "close() ended both waits"
    assert isinstance(errors[0], qsim.ClosedError)
    assert isinstance(waiting[0], qsim.ClosedError)
    with pytest.raises(qsim.ClosedError):
        p.call(lambda: 1)
    assert p.closed
    del t0


def test_ctrl_c_cancels_a_wait_at_once():
    """SIGINT during a 60 s backoff sleep raises KeyboardInterrupt in the
    sleeping main thread (the wait is interruptible), and the row is logged
    as not finished."""
    p = qsim.Pacer(workers=1, retry={"backoff": "constant", "delay_s": 60, "max_attempts": 2})
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        p.call(lambda: (_ for _ in ()).throw(Status(503)))
    rows = p.rows()
    assert rows["status"] == [None]
    assert rows["error"] == ["not finished: the call was interrupted"]
    # the worker was given back
    assert p.call(lambda: 5) == 5


def test_hints_are_read_by_the_one_reader_and_honoured():
    """A 429 with retry-after-ms 40 under a policy that honours hints waits
    exactly 40 ms (model time), with a virtual clock."""
    from vclock import VirtualClock

    clock = VirtualClock()
    p = qsim.Pacer(retry={"backoff": "constant", "delay_s": 5, "max_attempts": 2}, clock=clock)
    n = []

    def fn():
        n.append(1)
        if len(n) == 1:
            raise Status(429, {"retry-after-ms": "40"})
        return "ok"

    res = []
    clock.spawn(lambda: res.append(p.call(fn)))
    clock.run()
    assert res == ["ok"]
    log = p.attempts()
    assert log["retry_hint_s"][0] == 0.04
    assert log["start_s"] == [0.0, 0.04]


def test_requests_style_error_responses_are_returned_after_the_retries():
    class Resp:
        def __init__(self, status):
            self.status_code = status
            self.headers = {"Retry-After": "0"}
            self.text = '{"message": "slow down"}'

    p = qsim.Pacer(retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 2})
    r = p.call(lambda: Resp(429))
    assert r.status_code == 429
    log = p.attempts()
    assert log["status"] == [429, 429]
    assert log["error"][0] == "HTTP 429: slow down"


def test_managed_map_keeps_rows_in_flight_within_the_window():
    ep = Endpoint(hold=0.002)
    ep.fail = lambda n, row: Status(429) if n % 5 == 0 else None
    # the aimd preset: the managed executor with its window's ceiling at workers
    p = qsim.Pacer(workers=6, policy="aimd", managed={"retry_base_s": 0.001, "retry_cap_s": 0.01})
    assert p.client == "managed" and p.workers == 6
    out = p.map(ep, range(120))
    assert out == [{"row": i} for i in range(120)]
    assert ep.max_inflight <= 6
    assert p.window() is not None and p.window() <= 6


def test_map_on_a_pool_runs_workers_threads():
    ep = Endpoint(hold=0.002)
    p = qsim.Pacer(workers=3)
    assert p.map(ep, range(30)) == [{"row": i} for i in range(30)]
    assert ep.max_inflight == 3


def test_the_attempt_log_is_replays(tmp_path):
    p = qsim.Pacer(workers=2, retry={"backoff": "constant", "delay_s": 0.001, "max_attempts": 2})
    p.map(lambda r: {"usage": {"prompt_tokens": 3, "completion_tokens": 4}, "choices": [{"finish_reason": "stop"}]}, range(4))
    paths = p.write_log(str(tmp_path))
    head = open(paths[0]).readline().strip()
    assert head == ("experiment,row,attempt,sdk_retry,status,retry_hint_s,start_s,ttft_s,end_s,"
                    "input_tokens,output_tokens,finish_reason,error_kind,error")
    assert open(paths[1]).readline().strip() == (
        "experiment,row,status,attempts,latency_s,own_wait_s,output_tokens,finish_reason,error")
    df = p.attempts_frame()
    assert df.height == 4 and df["output_tokens"].to_list() == [4, 4, 4, 4]
