"""Golden model of the NPU (bit-exact executor and cycle-approximate timing) and program helpers."""
