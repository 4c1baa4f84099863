"""A token bucket: the bandwidth half of WAN emulation (time is an input)."""

from __future__ import annotations


class TokenBucket:
    """``rate`` bytes per second, bursts of up to ``burst`` bytes.

    :meth:`reserve` never refuses: a send larger than the tokens at hand goes into debt and
    is told how long to wait first, so back-to-back sends leave at exactly ``rate``."""

    def __init__(self, rate: float, burst: float) -> None:
        if rate <= 0 or burst <= 0:
            raise ValueError("rate and burst must be positive")
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = 0.0
        self._started = False

    def reserve(self, now: float, n: int) -> float:
        """Take ``n`` bytes' worth at time ``now``; returns the seconds to wait before sending."""
        if not self._started:
            self._at, self._started = now, True
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        self._tokens -= n
        return 0.0 if self._tokens >= 0 else -self._tokens / self.rate
