"""Record the tests' durations for the suite's order (tests/conftest.py): reads the output of
`pytest --durations=0` on stdin and writes tests/durations.json, the seconds of every test that
took at least a second (setup, call and teardown summed; the xdist group suffix dropped).

    .venv/bin/pytest -n auto --dist loadgroup --durations=0 | .venv/bin/python tests/record_durations.py
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^([\d.]+)s (?:setup|call|teardown)\s+(\S+)")


def main() -> int:
    seconds: dict[str, float] = defaultdict(float)
    for line in sys.stdin:
        m = LINE.match(line)
        if m:
            seconds[m.group(2).split("@")[0]] += float(m.group(1))
    kept = {k: round(v, 1) for k, v in sorted(seconds.items()) if v >= 1.0}
    if not kept:
        print("no durations in the input: run pytest with --durations=0", file=sys.stderr)
        return 1
    out = Path(__file__).with_name("durations.json")
    out.write_text(json.dumps(kept, indent=0, sort_keys=True) + "\n")
    print(f"{out}: {len(kept)} tests, {sum(kept.values()):.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
