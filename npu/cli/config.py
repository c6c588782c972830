"""`npu config`: the hardware presets and their configuration ids."""

from __future__ import annotations

import argparse
import json

from ..config import PRESETS, get_config

HELP = "show hardware configuration presets"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", nargs="?", help=f"one of {', '.join(PRESETS)} (default: all)")
    p.add_argument("--json", action="store_true", help="machine-readable output")


def run(args: argparse.Namespace) -> int:
    for n in [args.name] if args.name else list(PRESETS):
        cfg = get_config(n)
        if args.json:
            print(json.dumps({"name": cfg.name, "config_id": cfg.config_id, **cfg.hardware_dict()}))
        else:
            print(cfg.describe())
    return 0
