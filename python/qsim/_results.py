"""Results of ``qsim.run``, ``qsim.sweep`` and ``qsim.plan``."""

from __future__ import annotations

from typing import Any, Dict, List

# the Rust side's column types → polars dtypes (those the CLI's Parquet tables have)
_DTYPES = {
    "str": "String",
    "f64": "Float64",
    "i64": "Int64",
    "u64": "UInt64",
    "u32": "UInt32",
    "bool": "Boolean",
}


def frame(columns: List[tuple]):
    """Named, typed columns → a polars DataFrame (the polars package)."""
    try:
        import polars as pl
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(
            "to_polars() needs the polars package: pip install polars"
        ) from e
    return pl.DataFrame(
        [pl.Series(name, values, dtype=getattr(pl, _DTYPES[dtype])) for name, dtype, values in columns]
    )


class Result:
    """What ``qsim.run``/``sweep``/``plan`` returned: ``str(result)`` is the
    CLI's text report; ``to_polars()`` the CLI's ``--out DIR`` tables
    (``"runs"``: one row per (point, seed, subject) with every metric a
    column; ``"points"``: median, mean, p05, p95 over the seeds);
    ``to_dict()`` the same as columns; ``to_csv()`` the tidy records as
    ``--format csv`` prints them."""

    def __init__(self, native: Any) -> None:
        self._r = native

    def __str__(self) -> str:
        return self._r.text

    def __repr__(self) -> str:
        first = self._r.text.splitlines()[0] if self._r.text else ""
        return f"<qsim.Result {first!r}>"

    @property
    def text(self) -> str:
        return self._r.text

    def records(self) -> List[tuple]:
        """The tidy records: (point, seed, subject, metric, value)."""
        return self._r.records()

    def to_csv(self) -> str:
        return self._r.to_csv()

    def to_dict(self, table: str = "runs") -> Dict[str, list]:
        return {name: values for name, _, values in self._r.columns(table)}

    def to_polars(self, table: str = "runs"):
        return frame(self._r.columns(table))
