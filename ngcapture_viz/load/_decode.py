"""Read one capture line into the values of its row, decoding as little of it as is exact.

Three ways, tried in this order:

* **facts** — a line written by our server carries ``ngcapture_facts`` (``capture_core.facts``):
  the envelope and that small object are decoded into typed structs (msgspec), the request and
  response bodies are only validated and skipped, never built;
* **bodies** — a line without (trusted) facts: the envelope and the two request fields needed
  are decoded the same way, the response body is parsed and read by the dialect code of
  ``capture_core`` (the request, usually the largest part, is skipped);
* **exact** — anything the typed decoders do not accept as they are (a field of another type, a
  number out of range, JSON they may judge differently from the reference decoder): the line
  goes through ``capture_core``'s own reader (``orjson`` + the pydantic model), which also
  writes the reason a damaged line is damaged.

The first two accept only what the third accepts and give the same values (a test fuzzes this):
they decode a subset of lines faster, they never decide differently. One exception, known
and left: a number too large for a double (``1e999``) inside a body the typed decoders skip
makes the reference decoder refuse the whole line, while they read it. Finding such numbers
costs more than decoding (a regular expression reads ~60 MB/s here), and no writer we know
writes them: our server embeds only bodies the reference decoder has parsed.
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any, Final

import msgspec
import orjson

from capture_core._lines import json_kind
from capture_core.dialects import ResponseFacts, extract_response
from capture_core.facts import FACTS_KEY, FACTS_VERSION, tool_choice_indices
from capture_core.normalize import record_fields, validate_raw_line
from ngcapture_viz.load._call_values import CallValues, differences
from ngcapture_viz.load._line_types import (
    _BODIES_LINE,
    _FACTS_LINE,
    _NULL,
    _OPEN,
    _OTHER_LINE,
    _QUOTE,
    _STR,
    _BodiesLine,
    _Envelope,
    _Facts,
    _first,
    _OtherFactsLine,
    _RequestHead,
    micros,
)

__all__ = ["FactsMismatch", "LineDecoder", "NotAnObject"]


class LineDecoder:
    """Decodes lines of capture files; ``verify`` also recomputes the facts lines carry.

    ``mismatches`` collects ``(values, differing names)`` of lines whose stored facts differ
    from what their bodies give (with ``verify`` only; the values are the recomputed ones).
    """

    def __init__(self, *, verify: bool = False) -> None:
        self.verify = verify
        self.counts = {"facts": 0, "bodies": 0, "exact": 0}
        #: Whether the next line is expected to carry facts (lines of a file usually all do,
        #: or all do not): it picks the struct tried first, so most lines decode once.
        self.expect_facts = not verify

    def decode(self, line: bytes | memoryview, *, exact: bool = False) -> CallValues:
        """The values of a line.

        Args:
            line: the line's bytes (a JSON object; anything else raises).
            exact: skip the typed decoders (their result could differ for this line).

        Raises:
            InvalidRecordError: not a readable capture line (the reason says why).
            NotAnObject: JSON, but not an object (the message says what it is).
            orjson.JSONDecodeError: not JSON (the caller reports the line as damaged).
            FactsMismatch: ``verify`` only: the facts differ; its ``values`` are recomputed.
        """
        if not exact:
            try:
                values = self._typed(line)
            except (msgspec.DecodeError, orjson.JSONDecodeError, RecursionError, _Unsure):
                values = None
            if values is not None:
                self.counts[values.path] += 1
                return values
        self.counts["exact"] += 1
        data = orjson.loads(line)
        if not isinstance(data, dict):
            raise NotAnObject(f"{json_kind(data)}, not an object")
        values = _exact(data)
        if self.verify:
            stored = _convert_facts(data.get(FACTS_KEY))
            if stored is not None:
                names = differences(_from_facts(values.common(), stored), values)
                if names:
                    raise FactsMismatch(values, names)
        return values

    def _typed(self, line: bytes | memoryview) -> CallValues:
        if self.expect_facts:
            try:
                quick = _FACTS_LINE.decode(line)
            except msgspec.ValidationError:
                pass  # a field of another type: read it the other way, which says
            else:
                facts = quick.ngcapture_facts
                if facts is not None and facts.v == FACTS_VERSION:
                    _check_string(quick.request_raw)
                    _check_string(quick.response_raw)
                    return _from_facts(_common(quick), facts)
            self.expect_facts = False
        envelope: _BodiesLine | _OtherFactsLine
        try:
            envelope = _BODIES_LINE.decode(line)
        except msgspec.ValidationError:
            envelope = _OTHER_LINE.decode(line)  # raises again if the envelope is bad
        facts = envelope.ngcapture_facts if isinstance(envelope, _BodiesLine) else None
        if facts is not None and facts.v != FACTS_VERSION:
            facts = None
        _check_object(envelope.response)
        _check_string(envelope.request_raw)
        _check_string(envelope.response_raw)
        common = _common(envelope)
        if facts is not None and not self.verify:
            self.expect_facts = True
            return _from_facts(common, facts)
        computed = _from_bodies(common, envelope.dialect, envelope.request, envelope.response)
        if facts is not None:
            names = differences(_from_facts(common, facts), computed)
            if names:
                raise FactsMismatch(computed, names)
        return computed


def _common(envelope: _Envelope) -> tuple[Any, ...]:
    """The envelope's values, in ``CallValues`` order (``_Unsure`` when not certain)."""
    ref = envelope.model_ref
    started, completed = envelope.started_at, envelope.completed_at
    latency, ttft = envelope.latency_ms, envelope.latency_ttft_ms
    return (
        envelope.model_call_id,
        None if ref is None else ref.type,
        None if ref is None else ref.name,
        envelope.dialect,
        envelope.status_code,
        None if started is None else _seconds(started),
        None if completed is None else _seconds(completed),
        None if latency is None else _finite(latency),
        None if ttft is None else _finite(ttft),
        envelope.error_category,
    )


class FactsMismatch(Exception):
    """Raised by a verifying decode: the line's facts differ from its bodies."""

    def __init__(self, values: CallValues, names: list[str]) -> None:
        super().__init__(", ".join(names))
        self.values = values
        self.names = names


class NotAnObject(ValueError):
    """A line that is JSON but not an object."""


class _Unsure(Exception):
    """The typed decoders cannot be sure to match the exact reader on this line."""


def _check_object(raw: msgspec.Raw) -> None:
    """``response``: an object or null (or absent), as the line's model requires."""
    if _first(raw) not in (0, _OPEN, _NULL):
        raise _Unsure


def _check_string(raw: msgspec.Raw) -> None:
    if _first(raw) not in (0, _QUOTE, _NULL):
        raise _Unsure


def _seconds(value: float) -> int:
    result = micros(value)
    if result is None:
        raise _Unsure
    return result


def _finite(value: float) -> float:
    if not math.isfinite(value):
        raise _Unsure
    return value


def _convert_facts(value: object) -> _Facts | None:
    """Facts found in an already parsed line, when of the version this reader knows."""
    if not isinstance(value, dict):
        return None
    try:
        facts = msgspec.convert(value, _Facts)
    except msgspec.ValidationError:
        return None
    return facts if facts.v == FACTS_VERSION else None


def _from_facts(common: tuple[Any, ...], facts: _Facts) -> CallValues:
    return _build(
        common,
        response_id=facts.response_id,
        model=facts.model,
        stream=facts.stream,
        response_status=facts.response_status,
        finish_reason=facts.finish_reason,
        tokens=(
            facts.tokens_in,
            facts.tokens_out,
            facts.tokens_reasoning,
            facts.tokens_total,
            facts.cached_tokens,
            facts.cache_creation_tokens,
        ),
        reasoning=facts.reasoning_content,
        error_code=facts.error_code,
        error_message=facts.error_message,
        tools=[
            (
                t.call_id,
                t.type,
                t.name,
                t.arguments,
                t.arguments_raw,
                t.arguments_parse_error,
                t.choice_index,
            )
            for t in facts.tool_calls
        ],
        path="facts",
    )


def _from_bodies(
    common: tuple[Any, ...],
    dialect: str,
    request: _RequestHead | None,
    response_raw: msgspec.Raw,
) -> CallValues:
    response = orjson.loads(memoryview(response_raw)) if response_raw else None
    if response is not None and not isinstance(response, dict):
        raise _Unsure
    found = extract_response(dialect, response)
    model = found.model
    stream: bool | None = None
    if request is not None:
        stream = bytes(request.stream) == b"true"
        if model is None and _first(request.model) == _QUOTE:
            requested = _STR.decode(request.model)
            model = requested or None
    return _values(
        common,
        found,
        model=model,
        stream=stream,
        choices=tool_choice_indices(dialect, response),
        path="bodies",
    )


def _values(
    common: tuple[Any, ...],
    found: ResponseFacts,
    *,
    model: str | None,
    stream: bool | None,
    choices: list[int] | None,
    path: str,
) -> CallValues:
    t = found.tokens
    choice_of: list[int | None] = list(choices or ())
    if len(choice_of) != len(found.tool_calls):
        choice_of = [None] * len(found.tool_calls)
    return _build(
        common,
        response_id=found.response_id,
        model=model,
        stream=stream,
        response_status=found.response_status,
        finish_reason=found.finish_reason,
        tokens=(
            t.tokens_in,
            t.tokens_out,
            t.tokens_reasoning,
            t.tokens_total,
            t.cached_tokens,
            t.cache_creation_tokens,
        ),
        reasoning=found.reasoning,
        error_code=found.error_code,
        error_message=found.error_message,
        tools=[
            (
                c.call_id,
                c.type,
                c.name,
                None if c.arguments is None else orjson.dumps(c.arguments).decode(),
                c.arguments_raw,
                c.arguments_parse_error,
                choice,
            )
            for c, choice in zip(found.tool_calls, choice_of, strict=True)
        ],
        path=path,
    )


def _exact(data: dict[str, Any]) -> CallValues:
    """The reference reader: ``capture_core``'s validation and normalization."""
    fields = record_fields(validate_raw_line(data), 0)
    tools = fields["tool_calls"]
    choices = tool_choice_indices(fields["dialect"], data.get("response"))
    choice_of: list[int | None] = list(choices or ())
    if len(choice_of) != len(tools):
        choice_of = [None] * len(tools)
    ref = fields["model_ref"]
    started, completed = fields["started_at"], fields["completed_at"]
    return CallValues(
        fields["model_call_id"],
        None if ref is None else ref.type,
        None if ref is None else ref.name,
        fields["dialect"],
        fields["status_code"],
        None if started is None else _datetime_micros(started),
        None if completed is None else _datetime_micros(completed),
        fields["latency_total_ms"],
        fields["latency_ttft_ms"],
        fields["error_category"],
        response_id=fields["response_id"],
        model=fields["model"],
        stream=fields["stream"],
        response_status=fields["response_status"],
        finish_reason=fields["finish_reason"],
        tokens=(
            fields["tokens_in"],
            fields["tokens_out"],
            fields["tokens_reasoning"],
            fields["tokens_total"],
            fields["cached_tokens"],
            fields["cache_creation_tokens"],
        ),
        reasoning=fields["reasoning_content"],
        error_code=fields["error_code"],
        error_message=fields["error_message"],
        tools=[
            (
                c.call_id,
                c.type,
                c.name,
                None if c.arguments is None else orjson.dumps(c.arguments).decode(),
                c.arguments_raw,
                c.arguments_parse_error,
                choice,
            )
            for c, choice in zip(tools, choice_of, strict=True)
        ],
        path="exact",
    )


def _build(common: tuple[Any, ...], **derived: Any) -> CallValues:
    """``CallValues`` from the envelope's values (``CallValues.common``) and the derived ones."""
    return CallValues(*common, **derived)


def _datetime_micros(value: datetime) -> int:
    delta = value - _UTC_EPOCH
    return int((delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds)


_UTC_EPOCH: Final = datetime.fromisoformat("1970-01-01T00:00:00+00:00")
