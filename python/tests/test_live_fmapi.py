"""Live, counted outcomes: the FMAPI article's batch (200 rows) through the
Pacer and the real ``openai`` SDK against ``qsim serve`` of the Databricks
profile (a stand-in that throttles as FMAPI does), and a hand-written
``tenacity`` backoff beside it, each against what the simulation of that
policy predicts.

Three independent draws run at once (``qsim serve --seed k``, Pacer seed
k), as tests/it/replay_serve.rs does: one draw of a noisy system falls
outside a 90 % interval now and then by definition; the median of three
rarely. Verdicts are counts (rows succeeded, HTTP attempts, 429s), never
wall-clock speed. 127.0.0.1 only; every process is bounded and ended.
"""

import json
import random
import statistics
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

import qsim
from conftest import ROOT, qsim_bin

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
tenacity = pytest.importorskip("tenacity")

FMAPI = "builtin:experiments/fmapi-pacing.toml"
PROFILE = str(ROOT / "models" / "databricks-claude-haiku-4-5.toml")
MODEL = "databricks-claude-haiku-4-5"
# `qsim recommend experiments/fmapi-pacing.toml`'s winner (equal jitter with
# base_s 0.25, cap_s 32, 8 attempts; 10 workers; max_tokens 240), as overrides
# of the article's backoff experiment
RECOMMENDED = [
    "workers=10",
    "max_tokens=240",
    "experiment.exp2-backoff.retry.backoff=equal_jitter",
    "experiment.exp2-backoff.retry.base_s=0.25",
]
# the article's own backoff (min(2^n, 32) + U[0, 1) s, 8 attempts) at the same size
ARTICLE = ["workers=10", "max_tokens=240"]
DRAWS = 3
SCALE = 2.0


class Serve:
    """`qsim serve PROFILE` on 127.0.0.1 (a free port), ended on exit."""

    def __init__(self, seed, scale):
        self.p = subprocess.Popen(
            [qsim_bin(), "serve", PROFILE, "--listen", "127.0.0.1:0", "--time-scale", str(scale), "--seed", str(seed)],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        line = self.p.stdout.readline()
        assert "listening on " in line, line
        url = line.split("listening on ", 1)[1].split()[0]
        self.url = url if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"

    def close(self):
        self.p.kill()
        self.p.wait(10)


def prompts(seed, n=200):
    """The batch's prompts: about the experiment's input lengths (normal
    250 ± 15 tokens; qsim serve counts 4 characters a token)."""
    rnd = random.Random(seed)
    words = ["the", "food", "was", "and", "our", "but", "not", "too", "far", "bad"]
    out = []
    for i in range(n):
        k = max(150, int(rnd.gauss(250, 15))) - 6
        out.append(f"Summarise review {i} in three sentences: " + " ".join(rnd.choice(words) for _ in range(k)))
    return out


def predicted(sets, metrics, seeds=100):
    """The simulation's median and 90 % interval of each metric over seeds."""
    pts = qsim.run(FMAPI, set=sets, only=["exp2-backoff"], seeds=seeds).to_polars("points")
    out = {}
    for m in metrics:
        row = pts.filter(pts["metric"] == m).row(0, named=True)
        out[m] = (row["p05"], row["median"], row["p95"])
    return out


class Counting(httpx.Client):
    """An httpx client that counts every HTTP status it receives (the SDK's
    hidden retries included)."""

    def __init__(self, **kw):
        self.statuses = []
        self._lock = threading.Lock()
        super().__init__(event_hooks={"response": [self._count]}, **kw)

    def _count(self, resp):
        with self._lock:
            self.statuses.append(resp.status_code)


def pacer_draw(k, out, logs, stream=False, rows=200):
    serve = Serve(k, SCALE)
    try:
        pacer = qsim.Pacer.from_experiment(FMAPI, "exp2-backoff", set=RECOMMENDED, seed=k, time_scale=SCALE)
        # the SDK's own retries off: the Pacer makes them (policy sdk_retries = true)
        client = openai.OpenAI(api_key="x", base_url=serve.url, max_retries=0, timeout=600 / SCALE)

        def one(prompt):
            return client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=pacer.max_tokens, temperature=0
            )

        def one_streamed(prompt):
            # streamed, so the attempt log has each attempt's TTFT (qsim.first_token)
            s = client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=pacer.max_tokens,
                temperature=0, stream=True, stream_options={"include_usage": True},
            )
            text, finish, usage = [], None, None
            for chunk in s:
                if chunk.choices and chunk.choices[0].delta.content:
                    if not text:
                        qsim.first_token()
                    text.append(chunk.choices[0].delta.content)
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if chunk.usage is not None:
                    usage = {"prompt_tokens": chunk.usage.prompt_tokens, "completion_tokens": chunk.usage.completion_tokens}
            return {"text": "".join(text), "usage": usage, "choices": [{"finish_reason": finish}]}

        results = pacer.map(one_streamed if stream else one, prompts(k, rows))
        pacer.write_log(str(logs / f"draw{k}"))
        log = pacer.attempts()
        out[k] = {
            "ok": sum(1 for r in results if not isinstance(r, BaseException)),
            "http_requests": sum(1 for e in log["error_kind"] if e != "local_reject"),
            "http_429": sum(1 for s in log["status"] if s == 429),
            "ttft": sum(1 for t in log["ttft_s"] if t is not None),
            "summary": pacer.summary_csv(),
        }
    finally:
        serve.close()


def tenacity_draw(k, out):
    """The article's backoff written by hand with tenacity, the SDK's two
    hidden retries on (its default), 10 threads: no qsim in the loop."""
    serve = Serve(100 + k, 1.0)
    try:
        http = Counting(timeout=600)
        client = openai.OpenAI(api_key="x", base_url=serve.url, http_client=http)  # max_retries=2

        @tenacity.retry(
            retry=tenacity.retry_if_exception_type((openai.RateLimitError, openai.InternalServerError)),
            wait=tenacity.wait_exponential(multiplier=1, max=32) + tenacity.wait_random(0, 1),
            stop=tenacity.stop_after_attempt(8),
            reraise=True,
        )
        def one(prompt):
            return client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=240, temperature=0
            )

        def safe(p):
            try:
                return one(p)
            except openai.APIError as e:
                return e

        with ThreadPoolExecutor(10) as ex:
            results = list(ex.map(safe, prompts(100 + k)))
        out[k] = {
            "ok": sum(1 for r in results if not isinstance(r, BaseException)),
            "http_requests": len(http.statuses),
            "http_429": sum(1 for s in http.statuses if s == 429),
        }
    finally:
        serve.close()


def run_draws(fn, *extra):
    out = {}
    ths = [threading.Thread(target=fn, args=(k, out, *extra)) for k in range(1, DRAWS + 1)]
    for th in ths:
        th.start()
    for th in ths:
        th.join(900)
    assert len(out) == DRAWS, f"only {len(out)} of {DRAWS} draws finished"
    return out


def check(draws, pred, label):
    for m, (lo, med, hi) in pred.items():
        obs = statistics.median(d[m] for d in draws.values())
        print(f"{label} {m}: observed {[d[m] for d in draws.values()]} median {obs}, predicted {med} [{lo}, {hi}]")
        assert lo <= obs <= hi, f"{label}: {m} median {obs} outside the simulation's 90 % interval [{lo}, {hi}]"


def test_the_recommended_policy_through_the_pacer_and_the_openai_sdk(tmp_path):
    pred = predicted(RECOMMENDED, ["ok", "http_requests", "http_429"])
    assert pred["ok"] == (200, 200, 200), "the recommendation finishes every row in the simulation"
    draws = run_draws(pacer_draw, tmp_path)
    for k, d in draws.items():
        assert d["ok"] == 200, f"draw {k}: {d['ok']} of 200 rows succeeded"
    check(draws, {m: pred[m] for m in ("http_requests", "http_429")}, "pacer")
    # qsim compare takes the Pacer's summary as it takes a replay's
    sim = tmp_path / "sim.csv"
    r = subprocess.run([qsim_bin(), "run", FMAPI, "--only", "exp2-backoff", "--seeds", "20", "--format", "csv",
                        *sum((["--set", s] for s in RECOMMENDED), [])], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    sim.write_text(r.stdout)
    obs = tmp_path / "draw1" / "summary.csv"
    r = subprocess.run([qsim_bin(), "compare", str(sim), str(obs), "--metric", "ok,http_requests,http_429"],
                       capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "exp2-backoff" in r.stdout, r.stdout
    # ... and qsim calibrate hosted fits a profile to its attempt log as to a
    # replay's: a streamed run (after the counted draws: parsing a stream in
    # Python costs CPU that would slow the counted clients), TTFT marked by
    # qsim.first_token()
    streamed = {}
    pacer_draw(9, streamed, tmp_path, stream=True, rows=60)
    assert streamed[9]["ok"] == 60 and streamed[9]["ttft"] >= 60
    r = subprocess.run([qsim_bin(), "calibrate", "hosted", "--log", str(tmp_path / "draw9" / "attempts.csv"),
                        "--max-tokens", "240", "--bootstrap", "200"], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "calibrate hosted" in r.stdout, r.stdout


def test_a_tenacity_backoff_does_what_the_simulation_of_it_predicts():
    pred = predicted(ARTICLE, ["ok", "http_requests", "http_429"])
    draws = run_draws(tenacity_draw)
    check(draws, pred, "tenacity")
