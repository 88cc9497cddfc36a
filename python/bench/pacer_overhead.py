"""The Pacer's own CPU time per call: ``pacer.call(fn)`` against ``fn()``
for a no-op ``fn``, one thread and 8 threads (CPU seconds of the process,
not wall time). Run: ~/.cache/qsim-venv/bin/python python/bench/pacer_overhead.py"""

import threading
import time

import qsim

N = 100_000


def noop():
    return 1


def per_call(fn, n):
    t = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - t) / n


def main():
    for label, policy in [
        ("no retry", {"workers": 8}),
        ("article backoff + SDK layer + quota + throttle", {
            "workers": 8, "sdk_retries": True,
            "retry": {"backoff": "exponential", "max_attempts": 8},
            "retry_quota": {"capacity": 500}, "throttle": {"k": 2}}),
    ]:
        for log in (True, False):
            p = qsim.Pacer(policy, log=log)
            base = per_call(noop, N)
            paced = per_call(lambda: p.call(noop), N)
            print(f"{label}, log={log}: {1e6 * (paced - base):.2f} us CPU per call (1 thread)")
        p = qsim.Pacer(policy)

        def work():
            for _ in range(N // 8):
                p.call(noop)

        t = time.process_time()
        ths = [threading.Thread(target=work) for _ in range(8)]
        for th in ths:
            th.start()
        for th in ths:
            th.join()
        cpu = (time.process_time() - t) / (N // 8 * 8)
        print(f"{label}: {1e6 * cpu:.2f} us CPU per call (8 threads, incl. the no-op)")


if __name__ == "__main__":
    main()
