"""docs/guide/python.md's Python examples run as written (against `qsim
serve` of the Databricks profile for the one that calls an endpoint)."""

import contextlib
import re
import subprocess

import pytest

from conftest import ROOT, qsim_bin

GUIDE = ROOT / "docs" / "guide" / "python.md"
README = ROOT / "README.md"


def blocks(doc=GUIDE):
    return re.findall(r"```python\n(.*?)```", doc.read_text(), re.S)


def test_the_guide_has_its_examples():
    assert len(blocks()) >= 2


@contextlib.contextmanager
def served():
    """`qsim serve` of the Databricks profile on a free loopback port, and
    the names the docs' examples use (BASE_URL, TOKEN, MODEL)."""
    p = subprocess.Popen(
        [qsim_bin(), "serve", str(ROOT / "models" / "databricks-claude-haiku-4-5.toml"),
         "--listen", "127.0.0.1:0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        url = p.stdout.readline().split("listening on ", 1)[1].split()[0]
        yield {
            "BASE_URL": url if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1",
            "TOKEN": "local",
            "MODEL": "databricks-claude-haiku-4-5",
        }
    finally:
        p.kill()
        p.wait(10)


def test_the_readmes_example_runs(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.chdir(tmp_path)
    (code,) = blocks(README)
    with served() as ns:
        ns["PROMPTS"] = [f"Summarise review {i} in three sentences" for i in range(20)]
        exec(compile(code, str(README), "exec"), ns)
        assert len(ns["results"]) == 20
        assert not [r for r in ns["results"] if isinstance(r, Exception)]
        assert ns["pacer"].max_tokens == 240
        assert (tmp_path / "run1" / "attempts.csv").exists()


def test_the_guides_examples_run(tmp_path, monkeypatch):
    pytest.importorskip("openai")
    monkeypatch.chdir(tmp_path)
    with served() as ns:
        ns["PROMPTS"] = [f"Summarise review {i} in three sentences: the food was good" for i in range(20)]
        for code in blocks():
            exec(compile(code, str(GUIDE), "exec"), ns)
        assert ns["failed"] == []
        assert (tmp_path / "run1" / "attempts.csv").exists()
        assert "exp1-direct" in str(ns["r"])
