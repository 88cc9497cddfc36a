"""Same decisions: the Pacer against the simulation's caller.

For random client policies (every backoff family, caps, attempts, hints
honoured or not, the SDK's hidden layer, a retry quota, the adaptive
throttle, 1-12 workers) and random endpoints (token limits tight enough to
throttle, each retry-hint shape or none, 5xx at a random rate), the
simulation (`run_suite_observed`, qsim-sim's own driver) runs the
experiment; its endpoint's answers become the script of a fake endpoint
(the same reply after the same latency for the same row's k-th attempt;
a 5xx is sometimes a timeout exception instead); the Pacer, under a
virtual clock and fed that script, must then send every attempt at the
same time, retry or reject locally the same way and end every row with the
same outcome, for the same seed.
"""

import json
import pathlib
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import qsim
from qsim import _qsim
from vclock import VirtualClock

MODEL = pathlib.Path(__file__).resolve().parents[2] / "models" / "databricks-claude-haiku-4-5.toml"

BACKOFFS = ["none", "constant", "exponential", "full_jitter", "equal_jitter", "decorrelated"]
HINTS = ["none", "retry_after_header", "retry_after_ms", "body_retry_after"]


class FakeStatusError(Exception):
    """An HTTP error as an SDK raises it: status, response headers and body."""

    def __init__(self, status, headers, body):
        super().__init__(f"HTTP {status}")
        self.status_code = status
        self.response = FakeResponse(status, headers, body)


class FakeResponse:
    def __init__(self, status, headers, body):
        self.status_code = status
        self.headers = headers
        self.text = body


@st.composite
def policies(draw):
    backoff = draw(st.sampled_from(BACKOFFS))
    retry = {"backoff": backoff}
    if backoff != "none":
        retry["base_s"] = draw(st.sampled_from([0.05, 0.2, 0.5, 1.0, 2.0]))
        retry["cap_s"] = draw(st.sampled_from([0.5, 2.0, 8.0, 32.0]))
        retry["jitter_s"] = draw(st.sampled_from([0.0, 0.3, 1.0]))
        retry["delay_s"] = draw(st.sampled_from([0.1, 1.0, 2.0]))
        retry["max_attempts"] = draw(st.integers(1, 8))
        retry["retry_on"] = draw(st.sampled_from([["429"], ["429", "5xx"], ["5xx"], ["429", "503"]]))
        retry["honor_hint"] = draw(st.booleans())
    exp = {"name": "pacer", "client": "pool", "retry": retry}
    if draw(st.booleans()):
        exp["retry_quota"] = {
            "capacity": draw(st.integers(0, 40)),
            "cost": draw(st.integers(1, 10)),
            "success_increment": draw(st.integers(0, 3)),
        }
    if draw(st.booleans()):
        exp["throttle"] = {"k": draw(st.sampled_from([1.0, 1.5, 2.0])), "window_s": draw(st.sampled_from([5, 30, 120]))}
    suite = {
        "workers": draw(st.integers(1, 12)),
        "rows": draw(st.integers(5, 60)),
        "max_tokens": draw(st.sampled_from([128, 256, 512])),
        "sdk_retries": draw(st.booleans()),
        "sdk_max_retries": draw(st.integers(0, 3)),
        "otpm": draw(st.sampled_from([500, 1000, 2000, 5000])),
        "hint": draw(st.sampled_from(HINTS)),
        "errors": draw(st.sampled_from([0.0, 0.05, 0.2])),
        "timeouts": draw(st.booleans()),
    }
    return suite, exp


def toml_value(v):
    return json.dumps(v) if not isinstance(v, bool) else ("true" if v else "false")


def write_files(tmp, suite, exp):
    model = MODEL.read_text()
    otpm = 'name = "OTPM"\ncounts = "output_tokens"\nlimit = 20000\n'
    assert otpm in model
    model = model.replace(otpm, otpm.replace("20000", str(suite["otpm"])), 1)
    model = model.replace('hint = "none"', f'hint = "{suite["hint"]}"', 1)
    # server_error_rate is a top-level key: before the first table
    model = model.replace("[[limits]]", f"server_error_rate = {suite['errors']}\n\n[[limits]]", 1)
    (tmp / "model.toml").write_text(model)
    lines = [
        'kind = "hosted"',
        'endpoint = "model.toml"',
        f"rows = {suite['rows']}",
        f"max_tokens = {suite['max_tokens']}",
        f"workers = {suite['workers']}",
        f"sdk_retries = {toml_value(suite['sdk_retries'])}",
        f"sdk = {{ max_retries = {suite['sdk_max_retries']} }}",
        'input_tokens = { dist = "normal", mean = 250, sd = 15, min = 150 }',
        'output_tokens = { dist = "normal", mean = 168, sd = 30, min = 40 }',
        "",
        "[[experiment]]",
    ]
    for k, v in exp.items():
        if isinstance(v, dict):
            inner = ", ".join(f"{a} = {toml_value(b)}" for a, b in v.items())
            lines.append(f"{k} = {{ {inner} }}")
        else:
            lines.append(f"{k} = {toml_value(v)}")
    path = tmp / "exp.toml"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def reply_of(sim_attempt, hint_shape, as_timeout):
    """The fake endpoint's answer to an attempt the simulation's endpoint answered."""
    _, _, _, _, _, kind, status, hint, _, _ = sim_attempt
    if kind == "ok":
        return ("ok", {"usage": {"prompt_tokens": 250, "completion_tokens": 100}, "choices": [{"finish_reason": "stop"}]})
    if status >= 500 and as_timeout:
        return ("raise", TimeoutError("the read timed out"))
    headers, body = {}, json.dumps({"error": {"message": "rate limited"}})
    if hint is not None:
        if hint_shape == "retry_after_header":
            assert hint % 1_000_000_000 == 0
            headers["retry-after"] = str(hint // 1_000_000_000)
        elif hint_shape == "retry_after_ms":
            assert hint % 1_000_000 == 0
            headers["retry-after-ms"] = str(hint // 1_000_000)
        elif hint_shape == "body_retry_after":
            assert hint % 1_000_000 == 0
            body = json.dumps({"retry_after": hint // 1_000_000 / 1000, "error_code": "REQUEST_LIMIT_EXCEEDED"})
    return ("raise", FakeStatusError(status, headers, body))


def run_pacer(path, seed, sim, suite):
    """The same experiment through the Pacer, the simulation's answers as the endpoint."""
    by_row = {}
    for a in sim:
        if a[5] != "local_reject":
            by_row.setdefault(a[0], []).append(a)
    clock = VirtualClock()
    pacer = qsim.Pacer.from_experiment(path, "pacer", seed=seed, clock=clock)
    assert pacer.workers == suite["workers"]
    calls = {}
    lock = threading.Lock()
    state = {"next": 0}

    def fake(row):
        k = calls.get(row, 0)
        calls[row] = k + 1
        script = by_row.get(row, [])
        if k >= len(script):
            raise AssertionError(f"row {row}: the Pacer sent attempt {k + 1}, the simulation sent {len(script)}")
        a = script[k]
        latency = a[4] - a[3]
        # a 5xx shown as a timeout for every other row (decisions are the same where 5xx is retried)
        as_timeout = suite["timeouts"] and row % 2 == 1
        what, value = reply_of(a, suite["hint"], as_timeout)
        clock.sleep_until_ns(clock.now_ns() + latency)
        if what == "ok":
            return value
        raise value

    def worker():
        first = True
        while True:
            if not first:
                # the simulation starts a worker's next row as an event at now
                clock.sleep_until_ns(clock.now_ns())
            first = False
            with lock:
                row = state["next"]
                if row >= suite["rows"]:
                    return
                state["next"] += 1
            try:
                pacer.call(fake, row)
            except Exception:
                pass

    for _ in range(suite["workers"]):
        clock.spawn(worker)
    clock.run()
    return pacer


def compare(sim, pacer, suite):
    log = pacer.attempts()
    n = len(log["row"])
    assert n == len(sim), f"{n} attempts through the Pacer, {len(sim)} in the simulation"
    pac = sorted(
        (log["row"][i], log["attempt"][i], log["sdk_retry"][i], log["start_s"][i], log["error_kind"][i] == "local_reject", i)
        for i in range(n)
    )
    ref = sorted((a[0], a[1], a[2], a[3] / 1e9, a[5] == "local_reject", j) for j, a in enumerate(sim))
    for p, r in zip(pac, ref):
        assert p[:5] == r[:5], f"attempt differs: Pacer {p[:5]} simulation {r[:5]}"
    rows = pacer.rows()
    outcomes = {
        rows["row"][i]: (rows["status"][i], rows["attempts"][i], rows["own_wait_s"][i], rows["latency_s"][i])
        for i in range(len(rows["row"]))
    }
    ends = [a for a in sim if a[9] is not None]
    assert len(outcomes) == len(ends) == suite["rows"]
    for a in ends:
        status, attempts, own_wait, latency, _ = a[9]
        p = outcomes[a[0]]
        # a 5xx the fake raised as a timeout ends as a failed exchange (599)
        pstatus = 500 if (p[0] == 599 and status == 500) else p[0]
        assert (pstatus, p[1], p[2], p[3]) == (status, attempts, own_wait / 1e9, latency / 1e9), f"row {a[0]}"


@settings(
    max_examples=int(__import__("os").environ.get("QSIM_PY_EXAMPLES", "200")),
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(p=policies(), seed=st.integers(1, 2**32))
def test_the_pacer_decides_as_the_simulation(tmp_path, p, seed):
    suite, exp = p
    path = write_files(tmp_path, suite, exp)
    sim = _qsim.simulate_attempts(path, seed)
    pacer = run_pacer(path, seed, sim, suite)
    compare(sim, pacer, suite)


def test_the_comparison_sees_a_different_seed(tmp_path):
    """The property can fail: another seed's jitter moves the send times."""
    suite = {"workers": 4, "rows": 20, "max_tokens": 512, "sdk_retries": True, "sdk_max_retries": 2,
             "otpm": 2000, "hint": "none", "errors": 0.0, "timeouts": False}
    exp = {"name": "pacer", "client": "pool", "retry": {"backoff": "full_jitter", "max_attempts": 5}}
    path = write_files(tmp_path, suite, exp)
    sim = _qsim.simulate_attempts(path, 7)
    assert any(a[5] == "error" for a in sim), "the endpoint throttles"
    pacer = run_pacer(path, 7, sim, suite)
    compare(sim, pacer, suite)
    with pytest.raises(AssertionError):
        compare(sim, run_pacer(path, 8, sim, suite), suite)
