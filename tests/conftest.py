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
