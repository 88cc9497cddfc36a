"""qsim from Python.

- ``qsim.Pacer``: a sized client policy (workers, retries and jitter, the
  SDK's hidden retries, retry quota, adaptive throttle, provider hints, the
  managed executor's AIMD window) applied to your own calls — an ``openai``
  SDK method, a ``requests`` call, an async client — with every decision
  made by qsim's caller state machine, the code the simulation runs.
- ``qsim.run``, ``qsim.sweep``, ``qsim.plan``: the simulator as a library,
  the CLI's records and reports.

Errors are ``qsim.QsimError``; bad input is ``qsim.ConfigError`` with the
CLI's one-line message.
"""

from __future__ import annotations

from typing import Iterable, Optional

from . import _qsim
from ._pacer import Pacer, RejectedLocally, first_token
from ._results import Result

__version__ = _qsim.__version__
QsimError = _qsim.QsimError
ConfigError = _qsim.ConfigError
UnmetError = _qsim.UnmetError
ClosedError = _qsim.ClosedError

__all__ = [
    "Pacer",
    "Result",
    "run",
    "sweep",
    "plan",
    "QsimError",
    "ConfigError",
    "UnmetError",
    "ClosedError",
    "RejectedLocally",
    "first_token",
]


def run(
    file: str = "builtin:experiments/fmapi-pacing.toml",
    *,
    set: Iterable[str] = (),
    only: Iterable[str] = (),
    seed: int = 1,
    seeds: int = 1,
    max_requests: Optional[int] = None,
) -> Result:
    """``qsim run FILE``: an experiment file (``builtin:NAME`` for an
    embedded one), ``set`` overrides (``"workers=16"``), ``only`` these
    experiments, seeds ``seed .. seed + seeds - 1``."""
    return Result(
        _qsim.run(file, list(set), list(only), seed, seeds, max_requests)
    )


def sweep(
    file: str,
    vary: Iterable[str],
    *,
    set: Iterable[str] = (),
    only: Iterable[str] = (),
    seed: int = 1,
    seeds: int = 1,
    threads: Optional[int] = None,
    max_requests: Optional[int] = None,
) -> Result:
    """``qsim sweep FILE --vary ...``: ``vary`` as the CLI's
    (``"workers=8..128:x2"``, ``"policy=article,full-jitter"``)."""
    return Result(
        _qsim.sweep(
            file, list(vary), list(set), list(only), seed, seeds, threads, max_requests
        )
    )


def plan(
    *,
    capacity=None,
    reserve=None,
    threshold=None,
    names=None,
    semantics=None,
    unit=None,
    burst=None,
    model=None,
    replicas: Optional[int] = None,
    scenarios: Optional[str] = None,
    need=None,
    e2e_p95=None,
    set: Iterable[str] = (),
    only: Iterable[str] = (),
    seed: int = 1,
    seeds: int = 1,
    max_requests: Optional[int] = None,
) -> Result:
    """``qsim plan`` with its flags as keyword arguments
    (``capacity=1000, reserve="30,20,30"``)."""
    s = lambda v: None if v is None else str(v)  # noqa: E731
    return Result(
        _qsim.plan(
            s(capacity),
            s(reserve),
            s(threshold),
            s(names),
            s(semantics),
            s(unit),
            s(burst),
            s(model),
            replicas,
            scenarios,
            s(need),
            s(e2e_p95),
            list(set),
            list(only),
            seed,
            seeds,
            max_requests,
        )
    )
