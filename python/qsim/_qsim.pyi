"""Type stubs of the native module (crates/qsim-py)."""

from typing import List, Optional, Sequence, Tuple

__version__: str

class QsimError(Exception): ...

class ConfigError(QsimError):
    source: str
    field: str
    reason: str

class UnmetError(QsimError): ...
class ClosedError(QsimError): ...

Column = Tuple[str, str, list]
Outcome = Tuple[int, int, int, int, bool]

class PacerCore:
    def __init__(
        self,
        policy_json: Optional[str] = None,
        file: Optional[str] = None,
        experiment: Optional[str] = None,
        sets: Sequence[str] = ...,
        seed: int = 1,
        time_scale: float = 1.0,
        log: bool = True,
    ) -> None: ...
    client: str
    workers: int
    name: str
    seed: int
    time_scale: float
    sdk_retries: bool
    rows_planned: int
    max_tokens: int
    closed: bool
    def describe(self) -> str: ...
    def managed_params(self) -> Optional[Tuple[float, float, float, int]]: ...
    def now_ns(self) -> int: ...
    def wait_s(self, at: int) -> float: ...
    def close(self) -> None: ...
    def quota_level(self) -> Optional[int]: ...
    def window(self) -> Optional[float]: ...
    def begin(self, now: Optional[int] = None) -> int: ...
    def send(self, slot: int, now: Optional[int] = None) -> bool: ...
    def reply(
        self,
        slot: int,
        ok: bool,
        status: Optional[int] = None,
        headers: Sequence[Tuple[str, str]] = ...,
        body: Optional[str] = None,
        error_kind: Optional[str] = None,
        error: Optional[str] = None,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        finish_reason: Optional[str] = None,
        local_reject: bool = False,
        now: Optional[int] = None,
    ) -> tuple: ...
    def first_token(self, slot: int, now: Optional[int] = None) -> None: ...
    def abandon(self, slot: int) -> None: ...
    def m_start(self, rows: int) -> None: ...
    def m_dispatch(self, now: Optional[int] = None) -> List[Tuple[int, int]]: ...
    def m_poll(self) -> Optional[int]: ...
    def m_reply(
        self,
        slot: int,
        ok: bool,
        status: Optional[int] = None,
        headers: Sequence[Tuple[str, str]] = ...,
        body: Optional[str] = None,
        error_kind: Optional[str] = None,
        error: Optional[str] = None,
        input_tokens: Optional[int] = None,
        output_tokens: Optional[int] = None,
        finish_reason: Optional[str] = None,
        now: Optional[int] = None,
    ) -> tuple: ...
    def attempts(self) -> List[Column]: ...
    def rows(self) -> List[Column]: ...
    def summary_csv(self, seed: int = 1) -> str: ...
    def counts(self) -> Tuple[int, int, int, int, int]: ...

class RunResult:
    text: str
    def to_csv(self) -> str: ...
    def records(self) -> List[Tuple[int, int, str, str, float]]: ...
    def columns(self, table: str = "runs") -> List[Column]: ...

def run(
    file: str = ...,
    set: Sequence[str] = ...,
    only: Sequence[str] = ...,
    seed: int = 1,
    seeds: int = 1,
    max_requests: Optional[int] = None,
) -> RunResult: ...
def sweep(
    file: str,
    vary: Sequence[str],
    set: Sequence[str] = ...,
    only: Sequence[str] = ...,
    seed: int = 1,
    seeds: int = 1,
    threads: Optional[int] = None,
    max_requests: Optional[int] = None,
) -> RunResult: ...
def plan(*args: object) -> RunResult: ...
def simulate_attempts(file: str, seed: int = 1, set: Sequence[str] = ...) -> list: ...
