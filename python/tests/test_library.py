"""qsim.run / sweep / plan against the CLI: the same records, report and
tables for the same inputs and seed; errors with the CLI's line; the GIL
released while simulating."""

import subprocess
import threading

import polars as pl
import pytest

import qsim
from conftest import ROOT, qsim_bin

FMAPI = "builtin:experiments/fmapi-pacing.toml"


def cli(*args):
    r = subprocess.run([qsim_bin(), *args], capture_output=True, text=True, cwd=ROOT, timeout=300)
    return r.returncode, r.stdout, r.stderr


def test_run_equals_the_cli_records_report_and_tables(tmp_path):
    res = qsim.run(FMAPI, seeds=3, set=["workers=32"])
    code, out, err = cli("run", FMAPI, "--seeds", "3", "--set", "workers=32", "--format", "csv")
    assert code == 0, err
    assert res.to_csv() == out
    code, out, err = cli("run", FMAPI, "--seeds", "3", "--set", "workers=32", "--out", str(tmp_path / "d"))
    assert code == 0, err
    assert str(res) == out
    for table in ("runs", "points"):
        cli_df = pl.read_parquet(tmp_path / "d" / f"{table}.parquet")
        mine = res.to_polars(table)
        assert mine.schema == cli_df.schema, table
        assert mine.equals(cli_df), table
        assert res.to_dict(table) == cli_df.to_dict(as_series=False)


def test_run_of_a_shared_file_is_the_plan(tmp_path):
    res = qsim.run("builtin:experiments/shared-deployment.toml", only=["extreme"], seeds=2)
    code, out, err = cli("run", "builtin:experiments/shared-deployment.toml", "--only", "extreme",
                         "--seeds", "2", "--out", str(tmp_path / "d"))
    assert code == 0, err
    assert str(res) == out
    assert res.to_polars("runs").equals(pl.read_parquet(tmp_path / "d" / "runs.parquet"))


def test_plan_equals_the_cli():
    res = qsim.plan(capacity=1000, reserve="30,20,30", seed=3)
    code, out, err = cli("plan", "--capacity", "1000", "--reserve", "30,20,30", "--seed", "3")
    assert code == 0, err
    assert str(res) == out


def test_sweep_equals_the_cli(tmp_path):
    vary = ["workers=8,16", "max_tokens=128,256"]
    res = qsim.sweep(FMAPI, vary, only=["exp1-direct"], seeds=2)
    args = ["sweep", FMAPI, "--only", "exp1-direct", "--seeds", "2"]
    for v in vary:
        args += ["--vary", v]
    code, out, err = cli(*args, "--format", "csv")
    assert code == 0, err
    assert res.to_csv() == out
    code, out, err = cli(*args, "--out", str(tmp_path / "d"))
    assert code == 0, err
    assert str(res) == out
    assert res.to_polars("runs").equals(pl.read_parquet(tmp_path / "d" / "runs.parquet"))
    assert res.to_polars("points").equals(pl.read_parquet(tmp_path / "d" / "points.parquet"))


@pytest.mark.parametrize(
    "call,args",
    [
        (lambda: qsim.run("no/such.toml"), ["run", "no/such.toml"]),
        (lambda: qsim.run(FMAPI, set=["experiment.1.retry.max_attempts=0"]),
         ["run", FMAPI, "--set", "experiment.1.retry.max_attempts=0"]),
        (lambda: qsim.run(FMAPI, only=["nope"]), ["run", FMAPI, "--only", "nope"]),
        (lambda: qsim.sweep(FMAPI, ["workers=0,8"]), ["sweep", FMAPI, "--vary", "workers=0,8"]),
    ],
)
def test_errors_are_the_cli_line(call, args):
    with pytest.raises(qsim.ConfigError) as e:
        call()
    code, out, err = cli(*args)
    assert code == 2
    assert err == f"qsim: {e.value}\n"


def test_the_gil_is_released_while_simulating():
    """While a run simulates in another thread (2,000 seeds: ~0.8 CPU-s),
    this thread keeps running Python: millions of iterations, where a
    simulation holding the GIL would leave it one switch interval (5 ms:
    ~100,000 at most). Counted iterations, not time."""
    done = threading.Event()
    result = []

    def sim():
        result.append(qsim.run(FMAPI, seeds=2000))
        done.set()

    th = threading.Thread(target=sim)
    th.start()
    n = 0
    while not done.is_set():
        n += 1
    th.join()
    assert result and "exp1-direct" in str(result[0])
    assert n > 1_000_000, f"only {n} iterations ran beside the simulation"
