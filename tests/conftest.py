"""Shared test configuration.

With ``NGCAPTURE_REQUIRE_ALL=1`` (set by ``.ci/run``) a skipped test fails the run: CI must
exercise every optional part.
"""

from __future__ import annotations

import os

import pytest

REQUIRE_ALL = os.environ.get("NGCAPTURE_REQUIRE_ALL") == "1"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    report = outcome.get_result()
    if REQUIRE_ALL and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = f"skipped under NGCAPTURE_REQUIRE_ALL=1: {reason}"
