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


#: the longest tests first - a minute or two each: the real models' compiles and runs, the RTL
#: suites' Verilator builds and simulations, the ImageNet-class compiles - so that neither worker is
#: left running one of them alone at the end of the run (xdist hands tests, or whole xdist groups,
#: out in collection order); the other tests keep their order
LONG_FIRST = (
    "tests/real_models/",
    "tests/hdl/test_core_rtl.py",
    "tests/compiler/test_onnx_light_models.py",
    "tests/hdl/test_board_sim.py",
    "tests/hdl/test_soc.py",
    "tests/explore/test_cluster.py",
    "tests/compiler/test_arena.py",
    "tests/hdl/test_ring_rtl.py",
)


def pytest_collection_modifyitems(items) -> None:
    def rank(item) -> int:
        return next((i for i, p in enumerate(LONG_FIRST) if item.nodeid.startswith(p)), len(LONG_FIRST))

    items.sort(key=rank)
