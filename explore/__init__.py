"""Exploration over hardware configurations: `npu dse` (dse.py)."""
