"""How a parallel run (``make test``: pytest-xdist, ``-n 2``) splits the suite.

A unit of work is a test module: its tests run in order in one process, and its module- and
session-scoped fixtures (a JupyterLab, a Ray node, the e2e servers) start once there, as in a
serial run. Units are handed out in an order chosen so that no long module is left to run alone
at the end: the modules in :data:`FIRST`, then those with a ``slow`` test, then the rest in
collection order. The order is only a hint: a module missing from it runs all the same.

Shared files are the tests' own business: the modules that make the checkout's ``results/demo``
when it is missing do it under a lock (``notebooks/_setup.py``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from xdist.remote import Producer
    from xdist.scheduler import LoadFileScheduling

__all__ = ["DISTRIBUTIONS", "FIRST", "IN_ORDER", "make_scheduler", "order_units", "unit_of"]

#: The ``--dist`` modes that run as ``loadfile`` in this order: ``load`` (what ``-n`` means
#: alone) would start a module's fixtures in each process, two Ray nodes or JupyterLabs at once.
DISTRIBUTIONS = frozenset({"load", "loadfile"})

#: Set by the controller in each worker's ``workerinput`` when the units go in this order.
IN_ORDER = "ngcapture_units_in_order"

#: The longest modules (two to four minutes in all on two busy cores), started first in this
#: order, the first two at once (one per process).
FIRST = (
    # Ray gives its node a fixed 30 s to register: it starts beside a single busy process, not
    # beside a JupyterLab and a Chromium starting up.
    "tests/ngcapture_viz/test_ray_index.py",
    "tests/capture_core/test_reassembly_hypothesis.py",
    # A JupyterLab and Chromium each.
    "tests/ngcapture_viz/test_lab_browser.py",
    "tests/ngcapture_viz/test_notebook7.py",
    "tests/ngcapture_viz/test_lab_without_plotly.py",
    # Many servers and CLI processes.
    "tests/e2e/test_cli.py",
    "tests/ngcapture_viz/test_cli.py",
    "tests/e2e/test_observations.py",
)


def unit_of(nodeid: str) -> str:
    """The unit of work of a test: its module."""
    return nodeid.split("::", 1)[0]


def order_units(items: list[pytest.Item]) -> None:
    """Sort ``items`` in place, each module kept together and in its own order."""
    slow = {unit_of(item.nodeid) for item in items if item.get_closest_marker("slow")}
    first_seen: dict[str, int] = {}
    for item in items:
        first_seen.setdefault(unit_of(item.nodeid), len(first_seen))

    def rank(item: pytest.Item) -> tuple[int, int]:
        unit = unit_of(item.nodeid)
        if unit in FIRST:
            return 0, FIRST.index(unit)
        return (1 if unit in slow else 2), first_seen[unit]

    items.sort(key=rank)


def make_scheduler(config: pytest.Config, log: Producer) -> LoadFileScheduling:
    """xdist's ``loadfile`` scheduler, handing modules out in collection order."""
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False  # keep order_units' order, not "most tests first"
    return LoadFileScheduling(config, log)
