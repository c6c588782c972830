"""The device's DRAM as the driver hands it out: first-fit ranges (of whole pages, by the callers'
rounding) from one pool; a released range merges with its free neighbours."""

from __future__ import annotations


class DeviceMemory:
    """Free ranges of [start, end) DRAM bytes, sorted and disjoint."""

    def __init__(self, start: int, end: int):
        self.ranges: list[tuple[int, int]] = [(start, end)] if end > start else []

    def alloc(self, size: int) -> int | None:
        """The start of `size` bytes taken from the first free range that holds them, or None."""
        for i, (s, e) in enumerate(self.ranges):
            if e - s >= size:
                self.ranges[i : i + 1] = [(s + size, e)] if e - s > size else []
                return s
        return None

    def release(self, start: int, end: int) -> None:
        """Give [start, end) back (it must have come from `alloc`)."""
        merged: list[tuple[int, int]] = []
        for s, e in sorted([*self.ranges, (start, end)]):
            if merged and merged[-1][1] == s:
                merged[-1] = (merged[-1][0], e)
            else:
                merged.append((s, e))
        self.ranges = merged

    @property
    def free_bytes(self) -> int:
        return sum(e - s for s, e in self.ranges)

    @property
    def largest(self) -> int:
        """The largest range one `alloc` can return."""
        return max([e - s for s, e in self.ranges] + [0])
