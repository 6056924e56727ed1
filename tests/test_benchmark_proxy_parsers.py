"""The proxy benchmark's parsers (wrk report, /proc stat lines, py-spy raw stacks): text in, numbers out."""

import os
import sys

import pytest

from benchmarks.proxy_measure import (
    module_group,
    parse_cpu_line,
    parse_proc_stat,
    parse_pyspy_raw,
    parse_wrk,
    summarise_profile,
    tree_cpu_s,
    wrk_script,
)

WRK_REPORT = """\
Running 1s test @ http://127.0.0.1:38635
  1 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.68ms  646.51us   7.55ms   91.59%
    Req/Sec     2.43k   195.31     2.75k    60.00%
  Latency Distribution
     50%  646.51us
     75%    1.71ms
     90%    1.87ms
     99%    1.05s
  2418 requests in 10.00s, 1.38MB read
  Socket errors: connect 0, read 2, write 0, timeout 3
  Non-2xx or 3xx responses: 7
Requests/sec:    241.80
Transfer/sec:      1.37MB
status 200: 2411
status 502: 7
"""


def test_parse_wrk_reads_counts_latencies_errors_and_statuses() -> None:
    result = parse_wrk(WRK_REPORT)
    assert (result.requests, result.duration_s, result.req_s) == (2418, 10.0, 241.8)
    assert result.non_2xx == 7
    assert result.socket_errors == {"connect": 0, "read": 2, "write": 0, "timeout": 3}
    assert result.latency_s["50%"] == pytest.approx(646.51e-6)
    assert result.latency_s["99%"] == pytest.approx(1.05)
    assert result.statuses == {200: 2411, 502: 7}


def test_parse_wrk_refuses_text_that_is_not_a_report() -> None:
    with pytest.raises(ValueError, match="not a wrk report"):
        parse_wrk("/tmp/post.lua: unfinished string near '\"status'")


def test_parse_proc_stat_counts_fields_after_the_last_parenthesis() -> None:
    fields = ["S", "41", *["0"] * 9, "250", "75", "9", "9"]  # state ppid ... utime stime
    line = "1234 (python (x) y) " + " ".join(fields) + "\n"
    assert parse_proc_stat(line) == (41, 325)


def test_parse_cpu_line_leaves_idle_and_iowait_out_of_busy() -> None:
    busy, total = parse_cpu_line("cpu  100 5 50 1000 20 3 2 1 0 0")
    assert (busy, total) == (161, 1181)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_tree_cpu_of_this_process_is_positive() -> None:
    assert tree_cpu_s(os.getpid()) > 0


def test_pyspy_stacks_drop_the_process_root_and_count_self_and_inclusive() -> None:
    raw = (
        'process 7:"python -m capture_core.cli serve";main (/a/capture_core/cli.py:3);'
        "send (/v/lib/python3.11/site-packages/httpcore/_async/x.py:9) 3\n"
        'process 7:"python -m capture_core.cli serve";main (/a/capture_core/cli.py:3);'
        "run (/p/lib/python3.11/asyncio/runners.py:1);"
        "is_idle (/v/lib/python3.11/site-packages/httpcore/_async/y.py:2) 1\n"
    )
    stacks = parse_pyspy_raw(raw)
    assert stacks[0] == (
        [("main", "/a/capture_core/cli.py"),
         ("send", "/v/lib/python3.11/site-packages/httpcore/_async/x.py")],
        3,
    )  # fmt: skip
    profile = summarise_profile(stacks)
    assert profile.samples == 4
    assert profile.group_inclusive["httpcore"] == 4
    assert profile.group_self["httpcore"] == 4
    assert profile.group_inclusive["asyncio"] == 1
    assert profile.self_counts["send (httpcore)"] == 3
    assert profile.inclusive_counts["main (capture_core/cli.py)"] == 4


def test_module_group_names_packages_stdlib_and_our_modules() -> None:
    assert module_group("/v/lib/python3.13/site-packages/aiohttp/client.py") == "aiohttp"
    assert module_group("/r/lib/python3.11/asyncio/base_events.py") == "asyncio"
    assert module_group("/tmp/tree/capture_core/server/proxy.py") == "capture_core/server/proxy.py"
    assert module_group("<frozen runpy>") == "<frozen runpy>"


def test_wrk_script_cycles_over_the_rollout_ids_only_when_prefixed() -> None:
    prefixed = wrk_script(b'{"model":"m"}', prefixed=True, ids=8)
    assert "local prefixed = true" in prefixed
    assert "counter % 8" in prefixed
    assert '{"model":"m"}' in prefixed
    assert "local prefixed = false" in wrk_script(b"{}", prefixed=False)
