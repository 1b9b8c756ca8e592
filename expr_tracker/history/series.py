"""MetricSeries: the ring buffers alert rules read (one per metric a rule needs).

Values are floats (``bool``/``int`` converted by the caller), each with the time it was
recorded at and its step (``_step``), in three parallel lists
(``values``, ``times``, ``steps``) that rule functions slice directly. ``tail(n)`` is the last
``n`` recorded values.

The times are the alert engine's time base, not the wall clock: live, the monotonic clock
read when the row was committed (so they never go backwards and a wall-clock jump moves no
window); in a replay of recorded history, the recorded ``_time``.

Not thread-safe: ``append`` updates (and trims) the three lists in separate statements, so a
reader on another thread could see them disagree. The alert engine appends and evaluates
under one lock (``AlertEngine._lock``), which is what makes on_step vs the watchdog safe.

The buffer is a list trimmed in bulk: it keeps at least ``capacity`` values and at most about
twice that, so appending is O(1) amortised and a window is one C-level slice (no copy loop).
``ensure_capacity(n)`` grows it when a rule needing a wider window is added, so a window is
never silently truncated (docs/alerts.md "Rule options": point windows up to
``history.alert_window``).
"""

from __future__ import annotations

__all__ = ["MetricSeries"]


class MetricSeries:
    """Recorded values of one metric, oldest first.

    ``capacity`` is the number of most recent values guaranteed to be kept (>= 1).
    ``count`` counts every value ever appended; ``dropped`` those trimmed away.
    """

    __slots__ = ("name", "capacity", "values", "times", "steps", "count", "dropped", "limit")

    def __init__(self, name: str, capacity: int = 1) -> None:
        self.name = name
        self.capacity = max(int(capacity), 1)
        self.limit = self.capacity * 2 + 16
        self.values: list[float] = []
        self.times: list[float] = []
        self.steps: list[int] = []
        self.count = 0
        self.dropped = 0

    def __len__(self) -> int:
        return len(self.values)

    def __repr__(self) -> str:
        return f"MetricSeries({self.name!r}, capacity={self.capacity}, len={len(self.values)})"

    def ensure_capacity(self, n: int) -> None:
        """Keep at least ``n`` values from now on (never shrinks)."""
        if n > self.capacity:
            self.capacity = int(n)
            self.limit = self.capacity * 2 + 16

    def append(self, value: float, time: float, step: int) -> None:
        """Record ``value`` seen at ``time`` (the engine's time base) and ``step``."""
        values = self.values
        values.append(value)
        self.times.append(time)
        self.steps.append(step)
        self.count += 1
        if len(values) > self.limit:
            self.trim()

    def trim(self) -> None:
        """Drop the oldest values down to ``capacity`` (``append`` does this once the lists
        grew past ``limit``, about twice the capacity: O(1) amortised)."""
        values = self.values
        cut = len(values) - self.capacity
        del values[:cut]
        del self.times[:cut]
        del self.steps[:cut]
        self.dropped += cut

    @property
    def last(self) -> float | None:
        """The latest value, ``None`` before the first."""
        return self.values[-1] if self.values else None

    @property
    def last_time(self) -> float | None:
        """Time (the engine's time base) of the latest value, ``None`` before the first."""
        return self.times[-1] if self.times else None

    def tail(self, n: int) -> list[float] | None:
        """The last ``n`` values, oldest first; ``None`` when fewer than ``n`` were recorded."""
        values = self.values
        if len(values) < n:
            return None
        return values[-n:]
