"""The Pacer: qsim's caller state machine driving your own calls.

Every decision — send now or reject locally (adaptive throttle), retry
when (the SDK's hidden layer, then the policy's own backoff and jitter,
paid by the retry quota), give up — is made by qsim-core's caller state
machine (``Call``, ``PoolShared``, ``Managed``) in the native module, the
same code the simulation runs. This module only sleeps, sends and reports:

- ``call`` / ``acall``: one row through a pool of ``workers`` (a thread
  pool's or asyncio's: at most ``workers`` rows in progress, each holding
  its worker through its retries' sleeps, as ``ThreadPoolExecutor`` with
  ``MAX_WORKERS`` does);
- ``map``: a batch; with ``client = "managed"`` the managed executor's AIMD
  window decides how many rows are in flight and when a throttled row goes
  again.
"""

from __future__ import annotations

import asyncio
import collections
import contextvars
import csv
import inspect
import json
import os
import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, List, Optional

from . import _qsim
from ._replies import from_exception, from_result

ClosedError = _qsim.ClosedError
ConfigError = _qsim.ConfigError
QsimError = _qsim.QsimError


class RejectedLocally(QsimError):
    """The row's last attempt was rejected by the policy's own adaptive
    throttle (a 429 that never left this process)."""


def _none() -> None:
    return None


# the attempt in flight in this thread or task: (pacer, slot)
_CURRENT: "contextvars.ContextVar[Optional[tuple]]" = contextvars.ContextVar("qsim_attempt", default=None)


def first_token() -> None:
    """Mark the first streamed token of the attempt in flight (call it from
    inside the paced callable when a stream's first content arrives): the
    attempt log then has its TTFT, as ``qsim replay --stream`` records it,
    which ``qsim calibrate hosted`` fits latencies from. Outside a paced
    call it does nothing."""
    cur = _CURRENT.get()
    if cur is not None:
        pacer, slot = cur
        pacer._core.first_token(slot, pacer._now())


def _check_sdk(fn: Any) -> None:
    """The openai SDK retries on its own (``max_retries``, 2 by default),
    invisibly to the Pacer: refuse such a client. The Pacer makes the SDK's
    hidden retries itself when the policy has ``sdk_retries`` on (as the
    simulation models them), so the client must have ``max_retries=0``."""
    owner = getattr(fn, "__self__", None)
    client = getattr(owner, "_client", None)
    mr = getattr(client, "max_retries", None)
    if (
        isinstance(mr, int)
        and mr > 0
        and type(client).__module__.split(".")[0] == "openai"
    ):
        raise ConfigError(
            f"openai client: max_retries = {mr}: the SDK would retry on its own, unseen by the "
            "policy; create it with max_retries=0 (the Pacer makes the SDK's hidden retries itself "
            "when the policy has sdk_retries = true)"
        )


class _Waiter:
    __slots__ = ("event", "loop", "fut", "granted")

    def __init__(self, loop=None, fut=None) -> None:
        self.event = None if loop is not None else threading.Event()
        self.loop = loop
        self.fut = fut
        self.granted = False


class Pacer:
    """Calls that follow a sized client policy, decided by qsim's caller
    state machine.

    ``Pacer(policy_dict)`` or ``Pacer(workers=10, retry={...}, ...)``: the
    fields of a hosted experiment's client (``workers``, ``client``
    ``"pool"``/``"managed"``, ``policy`` (a named preset), ``retry``
    (``backoff`` none/constant/exponential/full_jitter/equal_jitter/
    decorrelated, ``base_s``, ``cap_s``, ``jitter_s``, ``delay_s``,
    ``max_attempts``, ``retry_on``, ``honor_hint``), ``sdk_retries`` and
    ``sdk`` (the SDK's hidden layer), ``retry_quota``, ``throttle``,
    ``managed``). ``Pacer.from_experiment(file, experiment)``: an experiment
    file's client, with ``set`` overrides.

    ``seed`` picks the client's random stream (jitter, throttle draws): the
    simulation's stream for the same seed. ``time_scale``: model seconds
    per real second (against a time-scaled ``qsim serve``). ``clock``: an
    injected clock (``now_ns()``, ``sleep_until_ns(at)``, ``async
    asleep_until_ns(at)``) in place of real time, for tests.
    """

    def __init__(
        self,
        policy_dict: Optional[dict] = None,
        /,
        *,
        seed: int = 1,
        time_scale: float = 1.0,
        log: bool = True,
        clock: Any = None,
        _file: Optional[str] = None,
        _experiment: Optional[str] = None,
        _set: Iterable[str] = (),
        **fields: Any,
    ) -> None:
        if _file is not None:
            if policy_dict is not None or fields:
                raise QsimError("give a policy or an experiment file, not both")
            core = _qsim.PacerCore(None, _file, _experiment, list(_set), seed, time_scale, log)
        else:
            p = dict(policy_dict or {})
            p.update(fields)
            core = _qsim.PacerCore(json.dumps(p), None, None, [], seed, time_scale, log)
        self._core = core
        self._clock = clock
        self._now = clock.now_ns if clock is not None else _none
        self._lock = threading.Lock()
        self._free = core.workers
        self._waiters: "collections.deque[_Waiter]" = collections.deque()
        self._closed = threading.Event()
        self._asleep: set = set()

    @classmethod
    def from_experiment(
        cls,
        file: str = "builtin:experiments/fmapi-pacing.toml",
        experiment: Optional[str] = None,
        *,
        set: Iterable[str] = (),
        **options: Any,
    ) -> "Pacer":
        """The client of ``experiment`` (needed when the file has several)
        of a hosted experiment file, after ``set`` (``PATH=VALUE``)
        overrides; its random stream is the one that experiment's client
        has in ``qsim run`` with the same seed."""
        return cls(_file=file, _experiment=experiment, _set=set, **options)

    # -- what it is --------------------------------------------------------

    @property
    def workers(self) -> int:
        """At most this many calls in flight."""
        return self._core.workers

    @property
    def client(self) -> str:
        return self._core.client

    @property
    def sdk_retries(self) -> bool:
        """Whether the Pacer makes the SDK's hidden retries (the SDK's own
        must be off: ``max_retries=0``)."""
        return self._core.sdk_retries

    @property
    def max_tokens(self) -> int:
        """The experiment's max_tokens (``from_experiment``): send it with every call."""
        return self._core.max_tokens

    @property
    def rows_planned(self) -> int:
        """The experiment's rows (``from_experiment``)."""
        return self._core.rows_planned

    @property
    def seed(self) -> int:
        return self._core.seed

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def quota_level(self) -> Optional[int]:
        """The retry quota's level (None: the policy has no quota)."""
        return self._core.quota_level()

    def window(self) -> Optional[float]:
        """The managed executor's AIMD window (None: a pool)."""
        return self._core.window()

    def __repr__(self) -> str:
        return f"qsim.Pacer({self._core.name}: {self._core.describe()})"

    # -- closing -----------------------------------------------------------

    def close(self) -> None:
        """Cancel every wait at once (waiting calls raise ``ClosedError``)
        and refuse new calls."""
        self._core.close()
        self._closed.set()
        with self._lock:
            waiters = list(self._waiters)
            self._waiters.clear()
            sleepers = list(self._asleep)
        for w in waiters:
            self._wake(w)
        for loop, fut in sleepers:
            try:
                loop.call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # the loop is closed
                pass

    def __enter__(self) -> "Pacer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    async def __aenter__(self) -> "Pacer":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.close()

    def _check(self) -> None:
        if self._closed.is_set():
            raise ClosedError("the Pacer is closed")

    # -- worker slots (a thread pool's or asyncio's workers) ----------------

    def _wake(self, w: _Waiter) -> None:
        if w.event is not None:
            w.event.set()
        else:
            try:
                w.loop.call_soon_threadsafe(_resolve, w.fut)
            except RuntimeError:
                pass

    def _acquire(self) -> None:
        with self._lock:
            self._check()
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            w = _Waiter()
            self._waiters.append(w)
        try:
            w.event.wait()
        except BaseException:
            self._give_up(w)
            raise
        if not w.granted:
            raise ClosedError("the Pacer is closed")

    async def _aacquire(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            self._check()
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            w = _Waiter(loop, loop.create_future())
            self._waiters.append(w)
        try:
            await w.fut
        except BaseException:
            self._give_up(w)
            raise
        if not w.granted:
            raise ClosedError("the Pacer is closed")

    def _give_up(self, w: _Waiter) -> None:
        """A waiter interrupted: out of the queue, or its slot passed on."""
        with self._lock:
            try:
                self._waiters.remove(w)
                return
            except ValueError:
                pass
        if w.granted:
            self._release()

    def _release(self) -> None:
        with self._lock:
            if self._waiters:
                w = self._waiters.popleft()
                w.granted = True
            else:
                self._free += 1
                return
        self._wake(w)

    # -- sleeping ----------------------------------------------------------

    def _sleep_until(self, at: int) -> None:
        if self._clock is not None:
            self._clock.sleep_until_ns(at)
            self._check()
            return
        d = self._core.wait_s(at)
        if d > 0 and self._closed.wait(d):
            raise ClosedError("the Pacer is closed")
        self._check()

    async def _asleep_until(self, at: int) -> None:
        if self._clock is not None:
            await self._clock.asleep_until_ns(at)
            self._check()
            return
        d = self._core.wait_s(at)
        if d > 0:
            loop = asyncio.get_running_loop()
            fut = loop.create_future()
            h = loop.call_later(d, _resolve, fut)
            key = (loop, fut)
            with self._lock:
                self._asleep.add(key)
            try:
                await fut
            finally:
                h.cancel()
                with self._lock:
                    self._asleep.discard(key)
        self._check()

    # -- one row -----------------------------------------------------------

    def _report(self, slot: int, rep) -> tuple:
        return self._core.reply(
            slot,
            rep.ok,
            rep.status,
            rep.headers,
            rep.body,
            rep.kind,
            rep.error,
            rep.input_tokens,
            rep.output_tokens,
            rep.finish_reason,
            False,
            self._now(),
        )

    @staticmethod
    def _outcome(o: tuple, last: Optional[tuple]) -> Any:
        status = o[0]
        if last is None:
            raise RejectedLocally(
                f"rejected locally by the adaptive throttle after {o[1]} attempt(s)"
            )
        raised, value = last
        if raised and status != 200:
            raise value
        return value

    def call(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """Call ``fn(*args, **kwargs)`` as one row under the policy: its
        return value, or its last exception when the row fails (an HTTP
        error response returned by ``fn`` is returned)."""
        _check_sdk(fn)
        self._acquire()
        try:
            return self._run(fn, args, kwargs)
        finally:
            self._release()

    def _run(self, fn, args, kwargs) -> Any:
        core = self._core
        now = self._now
        slot = core.begin(now())
        last = None
        try:
            while True:
                if core.send(slot, now()):
                    token = _CURRENT.set((self, slot))
                    try:
                        value = fn(*args, **kwargs)
                    except Exception as e:  # a failed attempt, never a crash
                        rep = from_exception(e)
                        last = (True, e)
                    else:
                        rep = from_result(value)
                        last = (False, value)
                    finally:
                        _CURRENT.reset(token)
                    nxt = self._report(slot, rep)
                else:
                    if self._clock is not None:
                        # the simulation answers a local rejection as an event at now
                        self._clock.sleep_until_ns(self._clock.now_ns())
                    last = None
                    nxt = core.reply(slot, False, local_reject=True, now=now())
                if nxt[0]:
                    slot = None
                    return self._outcome(nxt[1], last)
                self._sleep_until(nxt[1])
        finally:
            if slot is not None:
                core.abandon(slot)

    async def acall(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``call`` for asyncio: ``fn`` may return an awaitable (an async
        client's method); the waits are asyncio sleeps."""
        _check_sdk(fn)
        await self._aacquire()
        try:
            return await self._arun(fn, args, kwargs)
        finally:
            self._release()

    async def _arun(self, fn, args, kwargs) -> Any:
        core = self._core
        now = self._now
        slot = core.begin(now())
        last = None
        try:
            while True:
                if core.send(slot, now()):
                    token = _CURRENT.set((self, slot))
                    try:
                        value = fn(*args, **kwargs)
                        if inspect.isawaitable(value):
                            value = await value
                    except Exception as e:
                        rep = from_exception(e)
                        last = (True, e)
                    else:
                        rep = from_result(value)
                        last = (False, value)
                    finally:
                        _CURRENT.reset(token)
                    nxt = self._report(slot, rep)
                else:
                    if self._clock is not None:
                        await self._clock.asleep_until_ns(self._clock.now_ns())
                    last = None
                    nxt = core.reply(slot, False, local_reject=True, now=now())
                if nxt[0]:
                    slot = None
                    return self._outcome(nxt[1], last)
                await self._asleep_until(nxt[1])
        finally:
            if slot is not None:
                core.abandon(slot)

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        """``fn`` with every call paced (``acall`` for a coroutine function)."""
        if inspect.iscoroutinefunction(fn):

            async def paced_async(*args: Any, **kwargs: Any) -> Any:
                return await self.acall(fn, *args, **kwargs)

            paced_async.__wrapped__ = fn  # type: ignore[attr-defined]
            return paced_async

        def paced(*args: Any, **kwargs: Any) -> Any:
            return self.call(fn, *args, **kwargs)

        paced.__wrapped__ = fn  # type: ignore[attr-defined]
        return paced

    # -- a batch -----------------------------------------------------------

    def map(self, fn: Callable[[Any], Any], rows: Iterable[Any]) -> List[Any]:
        """``fn(row)`` for every row, in row order: its return value, or
        the exception of a row that failed. A pool runs ``workers`` threads
        (``ThreadPoolExecutor.map``); the managed executor sends as its
        AIMD window allows and re-queues throttled rows."""
        rows = list(rows)
        if self._core.client == "managed":
            return self._map_managed(fn, rows)
        _check_sdk(fn)
        out: List[Any] = [None] * len(rows)
        ex = ThreadPoolExecutor(max_workers=self.workers)
        try:
            futs = [ex.submit(self.call, fn, r) for r in rows]
            for i, f in enumerate(futs):
                try:
                    out[i] = f.result()
                except Exception as e:
                    out[i] = e
        except BaseException:
            self.close()
            ex.shutdown(wait=True, cancel_futures=True)
            raise
        ex.shutdown(wait=True)
        return out

    def _map_managed(self, fn, rows: list) -> List[Any]:
        _check_sdk(fn)
        core = self._core
        now = self._now
        n = len(rows)
        out: List[Any] = [None] * n
        done = 0
        replies: "queue.SimpleQueue" = queue.SimpleQueue()

        def send(slot: int, i: int) -> None:
            token = _CURRENT.set((self, slot))
            try:
                value = fn(rows[i])
            except Exception as e:
                replies.put((slot, i, from_exception(e), e))
            else:
                replies.put((slot, i, from_result(value), value))
            finally:
                _CURRENT.reset(token)

        self._check()
        core.m_start(n)
        ex = ThreadPoolExecutor(max_workers=self.workers)
        try:
            while done < n:
                for slot, i in core.m_dispatch(now()):
                    ex.submit(send, slot, i)
                at = core.m_poll()
                timeout = None if at is None else max(core.wait_s(at), 0.0)
                try:
                    slot, i, rep, value = replies.get(timeout=timeout)
                except queue.Empty:
                    continue
                self._check()
                nxt = core.m_reply(
                    slot,
                    rep.ok,
                    rep.status,
                    rep.headers,
                    rep.body,
                    rep.kind,
                    rep.error,
                    rep.input_tokens,
                    rep.output_tokens,
                    rep.finish_reason,
                    now(),
                )
                if nxt[0]:
                    out[i] = value
                    done += 1
        except BaseException:
            self.close()
            ex.shutdown(wait=False, cancel_futures=True)
            raise
        ex.shutdown(wait=True)
        return out

    # -- the attempt log ---------------------------------------------------

    def attempts(self) -> dict:
        """The attempt log, one row per attempt, in ``qsim replay``'s
        attempts.csv columns: {column: values}."""
        return {name: values for name, _, values in self._core.attempts()}

    def rows(self) -> dict:
        """Each finished row's outcome in ``qsim replay``'s rows.csv columns."""
        return {name: values for name, _, values in self._core.rows()}

    def attempts_frame(self):
        """The attempt log as a polars DataFrame (needs the polars package)."""
        from ._results import frame

        return frame(self._core.attempts())

    def rows_frame(self):
        from ._results import frame

        return frame(self._core.rows())

    def summary_csv(self, seed: Optional[int] = None) -> str:
        """The run's summary records (``qsim replay``'s summary.csv):
        ``qsim compare PREDICTION summary.csv`` compares them with a
        simulation's."""
        return self._core.summary_csv(self.seed if seed is None else seed)

    def write_log(self, directory: str) -> List[str]:
        """Write attempts.csv, rows.csv and summary.csv (``qsim replay --out
        DIR``'s files) into ``directory``: ``qsim calibrate hosted --log
        DIR/attempts.csv`` reads the first, ``qsim compare`` the last."""
        os.makedirs(directory, exist_ok=True)
        paths = []
        path = os.path.join(directory, "summary.csv")
        with open(path + ".tmp-qsim", "w", newline="") as f:
            f.write(self.summary_csv())
        os.replace(path + ".tmp-qsim", path)
        for name, cols in (("attempts.csv", self._core.attempts()), ("rows.csv", self._core.rows())):
            path = os.path.join(directory, name)
            tmp = path + ".tmp-qsim"
            with open(tmp, "w", newline="") as f:
                w = csv.writer(f, lineterminator="\n")
                w.writerow([c[0] for c in cols])
                n = len(cols[0][2]) if cols else 0
                for k in range(n):
                    w.writerow(["" if c[2][k] is None else _cell(c[2][k]) for c in cols])
            os.replace(tmp, path)
            paths.append(path)
        paths.append(os.path.join(directory, "summary.csv"))
        return paths

    def counts(self) -> dict:
        """rows finished, HTTP attempts sent, local rejections, SDK retries,
        model seconds from the first event to the last."""
        rows, sent, local, sdk, elapsed = self._core.counts()
        return {
            "rows": rows,
            "attempts": sent,
            "local_rejects": local,
            "sdk_retries": sdk,
            "elapsed_s": elapsed / 1e9,
        }


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return repr(v)
    return str(v)


def _resolve(fut) -> None:
    if not fut.done():
        fut.set_result(None)
