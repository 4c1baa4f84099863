"""Duty-cycled CPU load: busy for frac of every 10 ms, asleep the rest (bounded by `timeout`)."""

import sys
import time

frac = float(sys.argv[1])
period = 0.01
while True:
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < frac * period:
        pass
    time.sleep(max(0.0, period - (time.perf_counter() - t0)))
