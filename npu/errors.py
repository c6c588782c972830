"""`NpuError`: the base of every error caused by what the user gave (a file, a model, an option, a
program) or by the device, as opposed to a bug. The `npu` command prints its message as
`npu: error: ...`; each part's error class also keeps its built-in base (ValueError, RuntimeError)."""


class NpuError(Exception):
    """An error the user can act on: its message names the file, node, field or value."""
