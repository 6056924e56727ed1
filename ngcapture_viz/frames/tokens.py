"""The tokens frame: each rollout's token-id capture (docs/token-store.md), and its summary.

Two sources, either or both:

* the rollout records: ``_ng_token_capture`` (the collector's build metrics), ``mask_sample``
  and the token ids of the rebuilt ``response.output`` (what was delivered);
* the token store (``open_run(..., tokens_dir=...)``): each rollout's state (live, frozen,
  retired), its entries while they exist (calls, prompt and generated lengths) and the calls
  announced but never recorded.

Only lengths and counts are kept; no token id leaves the files.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Final

import polars as pl

from capture_core.ids import is_valid_rollout_id
from capture_core.tokens import (
    ENTRIES_SUFFIX,
    INCOMPLETE_SUFFIX,
    INTENTS_SUFFIX,
    MASK_SAMPLE_KEY,
    STATE_SUFFIX,
    TOKEN_CAPTURE_KEY,
    TokenCaptureStore,
)
from ngcapture_viz.frames._columns import Column, FrameSchema

__all__ = [
    "TOKENS",
    "TOKEN_STATES",
    "compact_tokens",
    "mask_reasons",
    "read_token_store",
    "token_capture_summary",
    "token_frame",
]

_INT = pl.Int64()
_STR = pl.String()
_FLOAT = pl.Float64()
_BOOL = pl.Boolean()

_LENGTHS: Final = ("prompt_tokens", "generated_tokens", "sequence_tokens")
#: Lifecycle states of a rollout's token capture, in lifecycle order.
TOKEN_STATES: Final = ("live", "frozen", "retired", "absent")

TOKENS: Final = FrameSchema(
    "tokens",
    [
        Column("run", pl.Categorical(), "The run's label."),
        Column("rollout_id", _STR, "The rollout."),
        Column(
            "source",
            _STR,
            "Where the row comes from: `rollouts` (the record's token capture), `store` (the "
            "token store only) or `both`.",
        ),
        Column(
            "calls",
            _INT,
            "Model calls captured: the store's entries while they exist, else the record's "
            "`n_calls`.",
        ),
        Column(
            "prompt_tokens",
            _INT,
            "The root prompt's length (the first token-bearing item of the rebuilt output; "
            "from the store: the shortest prompt).",
        ),
        Column("generated_tokens", _INT, "Generated tokens captured over all calls."),
        Column("delivered_tokens", _INT, "Generated tokens of the delivered (main) chain."),
        Column(
            "sequence_tokens",
            _INT,
            "The delivered sequence's length: last prompt plus its generation (from the "
            "store: the longest call).",
        ),
        Column("delivered_fraction", _FLOAT, "delivered_tokens / generated_tokens."),
        Column("chains", _INT, "Chains the calls formed (1 for a deliverable rollout)."),
        Column("quarantined_calls", _INT, "Calls left out of every chain."),
        Column(
            "masked",
            _BOOL,
            "The collector marked the rollout `mask_sample` (not to be trained on); null when "
            "no record says (no rollout file, or token capture was not delivered).",
        ),
        Column(
            "mask_reasons",
            _STR,
            "Why, comma-separated: `capture_incomplete`, `unresolved_parent_calls`, "
            "`multiple_roots`, `multiple_chains` or the error text.",
        ),
        Column(
            "state",
            _STR,
            "The token store's state: `live` (being written), `frozen` (snapshot taken, kept "
            "as evidence), `retired` (delivered and dropped: a fence), `absent` (no files); "
            "null without a token store.",
        ),
        Column("incomplete", _BOOL, "The store marks the rollout incomplete (a call was lost)."),
        Column(
            "lost_calls",
            _INT,
            "Calls announced to the store but never recorded (0 once retired: the files go).",
        ),
        Column("store_error", _STR, "Why the store could not be read for this rollout."),
    ],
)


def compact_tokens(row: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the tokens frame needs from one rollout record (``None``: no token capture).

    Example:
        >>> compact_tokens({"_ng_token_capture": {"n_calls": 1}, "response": {"output": [
        ...     {"prompt_token_ids": [1, 2], "generation_token_ids": [3]}]}})["sequence_tokens"]
        3
    """
    metrics = row.get(TOKEN_CAPTURE_KEY)
    masked = row.get(MASK_SAMPLE_KEY) is True
    if not isinstance(metrics, Mapping) and not masked:
        return None
    response = row.get("response")
    output = response.get("output") if isinstance(response, Mapping) else None
    carriers = [
        item
        for item in (output if isinstance(output, list) else ())
        if isinstance(item, Mapping) and item.get("generation_token_ids")
    ]
    compact: dict[str, Any] = {
        "metrics": dict(metrics) if isinstance(metrics, Mapping) else {},
        "masked": masked,
        "prompt_tokens": None,
        "sequence_tokens": None,
    }
    if carriers:
        first, last = carriers[0], carriers[-1]
        compact["prompt_tokens"] = _length(first.get("prompt_token_ids"))
        prompt, generated = (_length(last.get(k)) for k in ("prompt_token_ids",
                                                             "generation_token_ids"))  # fmt: skip
        if prompt is not None and generated is not None:
            compact["sequence_tokens"] = prompt + generated
    return compact


def mask_reasons(metrics: Mapping[str, Any], masked: bool) -> list[str]:
    """A masked rollout's reasons from its ``_ng_token_capture`` (the consumer's rule).

    An unmasked rollout has none; a masked one with none of the recorded causes was masked
    for unresolved retries (``unresolved_parent_calls``), which the record does not list.

    Example:
        >>> mask_reasons({"n_calls": 2, "chains": 2, "roots": 1}, True)
        ['multiple_chains']
    """
    if not masked:
        return []
    reasons = []
    if metrics.get("capture_incomplete"):
        reasons.append("capture_incomplete")
    error = metrics.get("error")
    if isinstance(error, str) and error:
        reasons.append(error)
    elif metrics.get("roots") not in (None, 1):
        reasons.append("multiple_roots")
    elif metrics.get("chains") not in (None, 1):
        reasons.append("multiple_chains")
    return reasons or ["unresolved_parent_calls"]


def read_token_store(directory: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Every rollout of a token store: state, counts and lengths (``rollout_id`` -> row).

    Raises:
        CaptureDirNotFoundError: the directory does not exist (readers never create it).
    """
    store = TokenCaptureStore(directory, create=False)
    suffixes = (STATE_SUFFIX, ENTRIES_SUFFIX, INTENTS_SUFFIX, INCOMPLETE_SUFFIX)
    ids: set[str] = set()
    for name in os.listdir(store.root):
        for suffix in suffixes:
            if name.endswith(suffix) and is_valid_rollout_id(name[: -len(suffix)]):
                ids.add(name[: -len(suffix)])
    return {rid: _store_row(store, rid) for rid in sorted(ids)}


def _store_row(store: TokenCaptureStore, rollout_id: str) -> dict[str, Any]:
    row: dict[str, Any] = {"rollout_id": rollout_id}
    try:
        state = store.state(rollout_id)
        row["incomplete"] = state.incomplete
        if state.retired:
            row.update(state="retired", lost_calls=0)
            return row
        entries = store.read_entries(rollout_id)
    except Exception as exc:  # damage is reported on the row, the rest of the store is read
        row["store_error"] = f"{type(exc).__name__}: {exc}"
        return row
    row["state"] = "frozen" if state.frozen else "live"
    recorded = {entry.model_call_id for entry in entries}
    intents = _intents(store.root / f"{rollout_id}{INTENTS_SUFFIX}")
    row["lost_calls"] = len(intents - recorded)
    if entries:
        row["calls"] = len(entries)
        row["prompt_tokens"] = min(len(e.prompt_token_ids) for e in entries)
        row["generated_tokens"] = sum(len(e.generation_token_ids) for e in entries)
        row["sequence_tokens"] = max(
            len(e.prompt_token_ids) + len(e.generation_token_ids) for e in entries
        )
    else:
        row["calls"] = 0
    return row


def _intents(path: Path) -> set[str]:
    """The call ids announced in an intents file (a torn last line is no intent)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return set()
    lines = data.split(b"\n")[:-1]  # bytes after the last newline were never acknowledged
    return {line.decode("utf-8", "replace") for line in lines if line.strip()}


def token_frame(
    label: str | None,
    records: Iterable[tuple[str, Mapping[str, Any] | None]],
    store: Mapping[str, Mapping[str, Any]] | None = None,
) -> pl.DataFrame:
    """The tokens frame of one run from ``(rollout_id, compact_tokens(record))`` pairs (the
    last record of each id) and, when given, :func:`read_token_store`'s rows."""
    rows: dict[str, dict[str, Any]] = {}
    for rollout_id, compact in records:
        if compact is None:
            continue
        metrics = compact["metrics"]
        masked = bool(compact["masked"])
        reasons = mask_reasons(metrics, masked)
        rows[rollout_id] = {
            "rollout_id": rollout_id,
            "source": "rollouts",
            "calls": _int(metrics.get("n_calls")),
            "prompt_tokens": compact["prompt_tokens"],
            "generated_tokens": _int(metrics.get("generated_tokens_captured")),
            "delivered_tokens": _int(metrics.get("generated_tokens_delivered")),
            "sequence_tokens": compact["sequence_tokens"],
            "delivered_fraction": _float(metrics.get("delivered_fraction")),
            "chains": _int(metrics.get("chains")),
            "quarantined_calls": _int(metrics.get("quarantined_calls")),
            "masked": masked,
            "mask_reasons": ", ".join(reasons) or None,
        }
    if store is not None:
        for rollout_id, stored in store.items():
            row = rows.setdefault(rollout_id, {"rollout_id": rollout_id, "source": "store"})
            if row["source"] == "rollouts":
                row["source"] = "both"
            for key, value in stored.items():
                if key in _LENGTHS and row.get(key) is not None:
                    continue  # what was delivered wins over the store's own account
                row[key] = value  # calls: the store's entries, while they exist
        for row in rows.values():
            if "store_error" not in row:  # an unreadable rollout's state is unknown
                row.setdefault("state", "absent")
    frame = TOKENS.from_rows(rows.values())
    return frame.with_columns(pl.lit(label, dtype=pl.String).cast(pl.Categorical).alias("run"))


def token_capture_summary(tokens: pl.DataFrame, labels: Sequence[str]) -> pl.DataFrame:
    """One row per run: rollouts with a token verdict, masked ones, the masked fraction and
    the reasons (``reason n, ...``, most frequent first), and the store states.

    Example:
        >>> token_capture_summary(run.tokens, run.labels)  # doctest: +SKIP
    """
    rows = []
    for label in labels:
        mine = tokens.filter(pl.col("run").cast(pl.String) == label)
        judged = mine.filter(pl.col("masked").is_not_null())
        masked = judged.filter(pl.col("masked"))
        reasons: Counter[str] = Counter()
        for text in masked["mask_reasons"].drop_nulls():
            reasons.update(part for part in text.split(", ") if part)
        states = Counter(mine["state"].drop_nulls().to_list())
        rows.append(
            {
                "run": label,
                "rollouts": mine.height,
                "delivered": judged.height,
                "masked": masked.height,
                "masked_fraction": masked.height / judged.height if judged.height else None,
                "mask_reasons": ", ".join(f"{r} {n}" for r, n in reasons.most_common()) or None,
                **{state: states.get(state, 0) for state in TOKEN_STATES},
                "lost_calls": int(mine["lost_calls"].sum()) if mine.height else 0,
            }
        )
    schema = {"run": _STR, "rollouts": _INT, "delivered": _INT, "masked": _INT,
              "masked_fraction": _FLOAT, "mask_reasons": _STR,
              **dict.fromkeys(TOKEN_STATES, _INT), "lost_calls": _INT}  # fmt: skip
    return pl.DataFrame(rows, schema=schema)


def _length(value: object) -> int | None:
    return len(value) if isinstance(value, list) else None


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _float(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
