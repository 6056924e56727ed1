"""The report's summary of each run: rollouts, calls, errors, gaps, token totals, time span.

:func:`summary_frame` is that summary as a frame, one row per run (a total no call reported is
null, not zero; ``<metric>_reported`` counts the calls that reported it). :func:`summary_section`
is the report's Summary section: where each run was read from, then tables of the runs, their
token totals and their latency. ``summary_frame`` is public through :mod:`ngcapture_viz.report`.
"""

from __future__ import annotations

import html

import polars as pl

from ngcapture_viz.display._html import Section, table_html
from ngcapture_viz.run import CaptureRun

__all__ = ["summary_frame", "summary_section"]

_TOKENS = ("tokens_in", "tokens_out", "tokens_reasoning", "cached_tokens")


def summary_frame(run: CaptureRun) -> pl.DataFrame:
    """One row per run: rollouts, calls, errors, gaps, token totals and their coverage, span.

    Token totals sum what calls reported and are null when no call reported the metric;
    ``<metric>_reported`` counts the calls that did (unknown is not zero).

    Example:
        >>> summary = summary_frame(run)  # doctest: +SKIP
        >>> summary.select("run", "calls", "tokens_in", "tokens_in_reported")  # doctest: +SKIP
    """
    calls = run.calls
    per_call = [
        pl.len().alias("calls"),
        pl.col("outcome").cast(pl.String).ne("ok").sum().alias("calls_not_ok"),
        pl.col("error_category").is_not_null().sum().alias("errors"),
    ]
    for name in _TOKENS:
        per_call += [
            pl.when(pl.col(name).count() > 0).then(pl.col(name).sum()).alias(name),
            pl.col(name).count().alias(f"{name}_reported"),
        ]
    per_call += [
        pl.col("latency_total_ms").count().alias("latency_reported"),
        pl.col("latency_ttft_ms").count().alias("ttft_reported"),
        pl.col("started_at").min().alias("first_call"),
        pl.col("completed_at").max().alias("last_call"),
    ]
    by_call = calls.group_by("run").agg(per_call)
    by_rollout = run.rollouts.group_by("run").agg(
        pl.len().alias("rollouts"),
        # Null when that source was not given (the flag is null throughout): unknown, not 0.
        *(
            pl.when(pl.col(flag).count() > 0).then(pl.col(flag).sum()).alias(name)
            for flag, name in (
                ("in_store", "rollouts_in_store"),
                ("in_rollouts", "rollouts_in_file"),
            )
        ),
    )
    by_gap = run.gaps.group_by("run").agg(pl.len().alias("gaps"))
    labels = pl.DataFrame({"run": run.labels}).with_columns(pl.col("run").cast(pl.String))
    frame = labels
    for part in (by_rollout, by_call, by_gap):
        frame = frame.join(part.with_columns(pl.col("run").cast(pl.String)), on="run", how="left")
    span = (pl.col("last_call") - pl.col("first_call")).dt.total_milliseconds() / 1000
    counts = ["rollouts", "calls", "gaps"]
    counts += ["calls_not_ok", "errors", "latency_reported", "ttft_reported"]
    counts += [f"{name}_reported" for name in _TOKENS]
    return frame.with_columns(
        [pl.col(c).fill_null(0).cast(pl.Int64) for c in counts]  # counts: none found is 0
        + [pl.col("rollouts_in_store", "rollouts_in_file").cast(pl.Int64), span.alias("span_s")]
    )


def summary_section(run: CaptureRun) -> Section:
    summary = summary_frame(run)
    overview = summary.select(
        "run",
        "rollouts",
        "rollouts_in_store",
        "rollouts_in_file",
        "calls",
        "calls_not_ok",
        "errors",
        "gaps",
        "first_call",
        "last_call",
        "span_s",
    )
    tokens = summary.select(
        "run",
        *(
            expr
            for name in _TOKENS
            for expr in (
                pl.col(name),
                pl.format("{} of {}", f"{name}_reported", "calls").alias(f"{name} reported by"),
            )
        ),
    )
    latency = run.calls.group_by("run").agg(
        expr
        for name in ("latency_total_ms", "latency_ttft_ms")
        for expr in (
            pl.col(name).quantile(0.5, "linear").alias(f"{name} p50"),
            pl.col(name).quantile(0.95, "linear").alias(f"{name} p95"),
            pl.format("{} of {}", pl.col(name).count(), pl.len()).alias(f"{name} reported by"),
        )
    )
    latency = (
        pl.DataFrame({"run": run.labels})
        .join(latency.with_columns(pl.col("run").cast(pl.String)), on="run", how="left")
        .sort(pl.col("run").replace_strict(run.labels, range(len(run.labels))))
    )
    sources = [
        f"<li><b>{html.escape(label)}</b>: capture dir {html.escape(str(one.capture_dir or '—'))}"
        f", rollout file {html.escape(str(one.rollouts_path or '—'))}</li>"
        for label, one in run.runs.items()
    ]
    body = (
        f"<ul>{''.join(sources)}</ul>"
        + table_html(overview, caption="Runs")
        + '<p class="note">"Reported by" counts the calls that reported a metric: a call that '
        "did not is unknown, not zero, and is left out of sums and percentiles.</p>"
        + table_html(tokens, caption="Tokens (sums of what calls reported)")
        + table_html(latency, caption="Latency and time to first token per call")
    )
    return Section("summary", "Summary", body)
