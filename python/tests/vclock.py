"""A virtual clock for the Pacer's tests: a deterministic discrete-event
scheduler over threads.

Exactly one participant runs at a time. ``sleep_until_ns(at)`` parks the
caller; when every participant is parked, the earliest wake-up runs, ties
in the order they were parked — the simulation's event queue contract
(time, then FIFO). So a run through the Pacer under this clock makes its
draws in the order the simulation's event loop makes them.
"""

import heapq
import threading


class VirtualClock:
    def __init__(self) -> None:
        self.t = 0
        self.heap = []
        self.seq = 0
        self.cv = threading.Condition()
        self.running = 0
        self.errors = []
        self.threads = []

    def now_ns(self) -> int:
        return self.t

    def _park(self, at: int) -> list:
        tok = [False]
        heapq.heappush(self.heap, (max(at, self.t), self.seq, tok))
        self.seq += 1
        return tok

    def _advance(self) -> None:
        if self.running == 0 and self.heap:
            at, _, tok = heapq.heappop(self.heap)
            self.t = at
            tok[0] = True
            self.running += 1
            self.cv.notify_all()

    def sleep_until_ns(self, at: int) -> None:
        with self.cv:
            tok = self._park(at)
            self.running -= 1
            self._advance()
            while not tok[0]:
                self.cv.wait()

    def spawn(self, fn, *args) -> None:
        """A participant that starts at the current time (after those parked at it)."""
        with self.cv:
            tok = self._park(self.t)

        def body():
            with self.cv:
                while not tok[0]:
                    self.cv.wait()
            try:
                fn(*args)
            except BaseException as e:  # reported by run()
                self.errors.append(e)
            finally:
                with self.cv:
                    self.running -= 1
                    self._advance()

        th = threading.Thread(target=body, daemon=True)
        th.start()
        self.threads.append(th)

    def run(self, timeout: float = 120.0) -> None:
        with self.cv:
            self._advance()
        for th in self.threads:
            th.join(timeout)
            assert not th.is_alive(), "a participant never finished"
        if self.errors:
            raise self.errors[0]
