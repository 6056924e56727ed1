"""The plotly.js bundles offered to a page: the vendored basic one only where it draws."""

from __future__ import annotations

import pytest
from plotly.offline import get_plotlyjs

from ngcapture_viz.display import bundles
from ngcapture_viz.display.bundles import (
    BASIC_TRACES,
    basic_plotlyjs,
    bundle_for,
    bundle_source,
    plotlyjs_version,
)


def test_the_vendored_basic_bundle_is_plotlys_major_version() -> None:
    basic = basic_plotlyjs()
    assert basic is not None, (
        "ngcapture_viz/display/assets/plotly-basic.min.js: run make vendor-plotly"
    )
    full_version, basic_version = plotlyjs_version(get_plotlyjs()), plotlyjs_version(basic)
    assert full_version is not None and basic_version is not None
    assert basic_version[0] == full_version[0]
    for trace in BASIC_TRACES:  # each trace module the bundle registers
        assert f'name:"{trace}",basePlotModule' in basic


def test_versions_are_read_from_the_opening_comment() -> None:
    assert plotlyjs_version("/**\n* plotly.js v4.1.1\n*/") == (4, 1, 1)
    assert plotlyjs_version("/**\n* plotly.js (basic - minified) v3.0.12\n*/") == (3, 0, 12)
    assert plotlyjs_version("function(){}") is None


def test_only_figures_the_basic_bundle_draws_get_it() -> None:
    assert bundle_for(["scatter", "bar", "scatter"]) == "basic"
    assert bundle_for([]) == "basic"
    for other in ("scattergl", "box", "heatmap", "violin", "histogram"):
        assert bundle_for(["scatter", other]) == "full"
    assert bundle_source("basic")[0] == "basic"
    assert bundle_source("full") == ("full", get_plotlyjs())
    assert bundle_source("anything else")[0] == "full"


def test_another_major_version_falls_back_to_the_full_bundle(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    basic_plotlyjs.cache_clear()
    monkeypatch.setattr(bundles, "get_plotlyjs", lambda: "/**\n* plotly.js v99.0.0\n*/")
    try:
        assert basic_plotlyjs() is None
        assert bundle_for(["scatter"]) == "full"
        assert bundle_source("basic")[0] == "full"
    finally:
        basic_plotlyjs.cache_clear()
