"""Host driver and runtime (not built yet: see the driver issue)."""
