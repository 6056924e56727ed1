"""Shared test configuration.

With ``NGCAPTURE_REQUIRE_ALL=1`` (set by ``.ci/run``) a skipped test fails the run: CI must
exercise every optional part. That holds for a module skipped while it is collected too, and in
a parallel run (``make test`` runs ``pytest -n 2``), where each worker process fails its own
skips before reporting them. How a parallel run splits the suite: ``tests/_parallel.py``.
"""

from __future__ import annotations

import os

import pytest

from tests import _parallel

REQUIRE_ALL = os.environ.get("NGCAPTURE_REQUIRE_ALL") == "1"


def _fail_a_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under NGCAPTURE_REQUIRE_ALL=1: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_a_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _fail_a_skip(outcome.get_result())


def _distributed(config: pytest.Config) -> bool:
    return getattr(config.option, "dist", "no") in _parallel.DISTRIBUTIONS


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):  # type: ignore[no-untyped-def]
    return _parallel.make_scheduler(config, log) if _distributed(config) else None


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:  # type: ignore[no-untyped-def]
    # A worker sees ``dist`` as "no": the controller tells it to put its units in order.
    node.workerinput[_parallel.IN_ORDER] = _distributed(node.config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Only in the worker processes of a parallel run: a serial run keeps the collection order.
    if getattr(config, "workerinput", {}).get(_parallel.IN_ORDER):
        _parallel.order_units(items)
