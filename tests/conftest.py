from hypothesis import settings

settings.register_profile("ci", deadline=None, print_blob=True)
settings.load_profile("ci")


def pytest_addoption(parser):
    parser.addoption(
        "--rtl-seeds",
        type=int,
        default=40,
        help="random programs per preset in the RTL differential suite (default 40; make test-all: 100)",
    )
    parser.addoption(
        "--rtl-sweep",
        type=int,
        default=1000,
        help="random programs per preset in the long sweep (tests marked slow: make test-slow)",
    )


def _module_seconds() -> dict[str, float]:
    """Each test file's recorded seconds (tests/durations.json), summed."""
    import json
    from collections import defaultdict
    from pathlib import Path

    try:
        tests = json.loads(Path(__file__).with_name("durations.json").read_text())
    except (OSError, ValueError):
        return {}
    out: dict[str, float] = defaultdict(float)
    for nodeid, seconds in tests.items():
        out[nodeid.split("::")[0]] += seconds
    return out


def pytest_collection_modifyitems(items) -> None:
    """The longest test files first (their recorded seconds, tests/durations.json, written by
    tests/record_durations.py), each file's tests together and in their order (a module's fixtures
    are set up once). xdist hands a worker its next test when it has two left, whole groups first,
    then the other tests in collection order: with the real models' minute-long tests among the
    last, one worker ran them alone for almost two minutes at the end (964 against 854 s of tests).
    A file not recorded counts as short; a stale record only changes the order."""
    seconds = _module_seconds()
    items.sort(key=lambda item: -seconds.get(item.nodeid.split("::")[0], 0.0))
