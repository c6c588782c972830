"""Amaranth RTL of the NPU core (not built yet: see the RTL issue)."""
