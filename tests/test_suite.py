"""The test suite's own machinery: `make test` relies on xdist's `--dist loadgroup` keeping the tests
of one `xdist_group` (each preset's RTL simulation, each Verilator build) on one worker. pytest 9 with
pytest-xdist 3.8 silently ignored the groups, so every preset's RTL suite ran on both workers."""

import pytest


@pytest.mark.xdist_group("suite-probe")
def test_xdist_groups_reach_the_scheduler(request):
    if request.config.getoption("dist", "no") == "loadgroup":
        assert request.node.nodeid.endswith("@suite-probe"), request.node.nodeid
