"""Latency, token, throughput and error tables over the calls frame, each with its coverage.

Every table is long: one row per group and metric, with ``n_calls`` (calls in the group),
``n_reported`` (calls that reported the metric) and ``coverage`` (their share). A metric no call
of a group reported has null statistics and coverage 0: unknown is never zero.

By concept: ``latency`` (percentiles and ECDF points), ``tokens`` (token and throughput
summaries), ``rates`` (error rates and coverage), ``histogram`` (token histograms),
``over_time`` (calls per time bucket); ``_tables`` holds what they share (grouping by ``by``,
typing, sorting, the coverage columns). The tables' schemas, ``ANY_ERROR`` and
``THROUGHPUT_METRIC`` can be imported from here too (``X as X`` below), outside ``__all__``.

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> run = ngv.open_run("results/demo/ckpt-100/model-calls")  # doctest: +SKIP
    >>> latency_percentiles(run.calls, by=("model",))  # doctest: +SKIP
"""

from ngcapture_viz.stats._tables import DEFAULT_BY
from ngcapture_viz.stats.histogram import HISTOGRAM_SCHEMA as HISTOGRAM_SCHEMA
from ngcapture_viz.stats.histogram import token_histogram
from ngcapture_viz.stats.latency import DISTRIBUTION_SCHEMA as DISTRIBUTION_SCHEMA
from ngcapture_viz.stats.latency import (
    LATENCY_METRICS,
    PERCENTILES,
    latency_distribution,
    latency_percentiles,
)
from ngcapture_viz.stats.latency import LATENCY_SCHEMA as LATENCY_SCHEMA
from ngcapture_viz.stats.over_time import OVER_TIME_SCHEMA as OVER_TIME_SCHEMA
from ngcapture_viz.stats.over_time import calls_over_time, time_interval
from ngcapture_viz.stats.rates import ANY_ERROR as ANY_ERROR
from ngcapture_viz.stats.rates import COVERAGE_SCHEMA as COVERAGE_SCHEMA
from ngcapture_viz.stats.rates import ERROR_SCHEMA as ERROR_SCHEMA
from ngcapture_viz.stats.rates import coverage, error_rates
from ngcapture_viz.stats.tokens import THROUGHPUT_METRIC as THROUGHPUT_METRIC
from ngcapture_viz.stats.tokens import THROUGHPUT_SCHEMA as THROUGHPUT_SCHEMA
from ngcapture_viz.stats.tokens import TOKEN_METRICS, throughput_summary, token_summary
from ngcapture_viz.stats.tokens import TOKEN_SCHEMA as TOKEN_SCHEMA

__all__ = [
    "DEFAULT_BY",
    "LATENCY_METRICS",
    "PERCENTILES",
    "TOKEN_METRICS",
    "calls_over_time",
    "coverage",
    "error_rates",
    "latency_distribution",
    "latency_percentiles",
    "throughput_summary",
    "time_interval",
    "token_histogram",
    "token_summary",
]
