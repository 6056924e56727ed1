"""The upstream's address never reaches the client through an answer's headers: ``Refresh``
URLs and ``Link`` targets are read the way ``Location`` is (``proxy._rewrite_*``)."""

from __future__ import annotations

import time

import pytest

from capture_core.server.proxy import AnswerRefusedError, _Origin, _rewrite_links, _rewrite_refresh

ORIGIN = _Origin.parse("http://127.0.0.1:8001/v1")
PREFIX = b"/ng-rollout/r-1"


@pytest.mark.parametrize(
    ("value", "client_sees"),
    [
        (b"0; url=http://127.0.0.1:8001/v1/x", b"0; url=/ng-rollout/r-1/x"),
        (b"0.5;URL='http://127.0.0.1:8001/v1/x?a=1'", b"0.5;URL='/ng-rollout/r-1/x?a=1'"),
        (b'  3 , url = "http://127.0.0.1:8001/v1/y"', b'  3 , url = "/ng-rollout/r-1/y"'),
        (b"2; http://127.0.0.1:8001/v1/z", b"2; /ng-rollout/r-1/z"),  # no "url="
        (b"0;url=/v1/abc", b"0;url=/ng-rollout/r-1/abc"),  # the upstream's own path
        (b"0; url=next", b"0; url=next"),  # relative to the proxied URL already
        (b"0 http://127.0.0.1:8001/v1/w", b"0 /ng-rollout/r-1/w"),  # a space for a separator
        (b"5", b"5"),  # a delay alone: the same page again
        (b"not a refresh", b"not a refresh"),
    ],
)
def test_a_refresh_url_is_read_as_a_location(value: bytes, client_sees: bytes) -> None:
    assert _rewrite_refresh(value, ORIGIN, PREFIX) == client_sees


@pytest.mark.parametrize(
    "value",
    [
        b"0; url=http://127.0.0.1:9/x",
        b"0;url=//other.example/x",
        b"1; url=\\\\evil/x",
        b"0 http://127.0.0.1:9/x",
        b"0; url=http://[::1/x",
    ],
)
def test_a_refresh_to_another_host_is_refused(value: bytes) -> None:
    with pytest.raises(AnswerRefusedError):
        _rewrite_refresh(value, ORIGIN, PREFIX)


def test_links_to_the_upstream_point_at_the_proxy_and_others_stay() -> None:
    value = (b"<http://127.0.0.1:8001/v1/files?page=2>; rel=next, </v1/files>; rel=first, "
             b"<https://docs.example/api>; rel=help, <//127.0.0.1:8001/v1/a>, <rel/ative>")  # fmt: skip
    assert _rewrite_links(value, ORIGIN, PREFIX) == (
        b"</ng-rollout/r-1/files?page=2>; rel=next, </ng-rollout/r-1/files>; rel=first, "
        b"<https://docs.example/api>; rel=help, </ng-rollout/r-1/a>, <rel/ative>"
    )


def test_a_link_that_is_not_a_url_is_left_as_it_is() -> None:
    value = b"<http://[::1/x>; rel=preload, <http://127.0.0.1:8001/v1/a>"
    assert (
        _rewrite_links(value, ORIGIN, PREFIX)
        == b"<http://[::1/x>; rel=preload, </ng-rollout/r-1/a>"
    )


@pytest.mark.parametrize(
    ("rewrite", "value"),
    [(_rewrite_refresh, b" " * 65536 + b"x"), (_rewrite_refresh, b"0;a" + b" " * 65536 + b"b"),
     (_rewrite_links, b"<" * 65536)],
)  # fmt: skip
def test_hostile_header_values_are_read_in_linear_time(rewrite: object, value: bytes) -> None:
    """These run on the event loop for every answer: a quadratic pattern took 5 s at 32 KiB."""
    started = time.perf_counter()
    rewrite(value, ORIGIN, PREFIX)  # type: ignore[operator]
    assert time.perf_counter() - started < 1.0  # linear: ~1 ms here; quadratic: ~20 s
