"""Grade multiple-choice answers: find the chosen letter in the model's text, compare it.

The reward is 1.0 when the parsed letter equals the row's ``answer`` and 0.0 otherwise (no
letter found included); a row without an ``answer`` is not graded (reward ``None``). NeMo Gym
MCQA rows (``options`` as a list, ``expected_answer``) are graded as NeMo Gym grades them
(:func:`~capture_core.collect.mcqa.grade_mcqa`: ``reward`` and ``extracted_answer``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from capture_core.collect.mcqa import grade_mcqa, is_mcqa_row

__all__ = ["grade", "parse_answer"]

_LETTERS: Final = "ABCDEFGHIJ"
# Most explicit first: "the answer is (B)" / "Answer: B", then a lone "(B)", then a bare "B".
_PATTERNS: Final = (
    re.compile(r"(?i:answer)\s*(?:(?i:is)|:)\s*:?\s*\(?([A-J])\)?(?![A-Za-z0-9])"),
    re.compile(r"\(([A-J])\)"),
    re.compile(r"\A\s*([A-J])\s*[.)]?\s*\Z"),
)


def parse_answer(text: str, letters: str = _LETTERS) -> str | None:
    """The option letter a text chooses (the last one stated the most explicitly), or None.

    Example:
        >>> parse_answer("Given the tool result, the answer is (C).")
        'C'
        >>> parse_answer("I am not sure.") is None
        True
    """
    for pattern in _PATTERNS:
        found = [letter for letter in pattern.findall(text) if letter in letters]
        if found:
            return str(found[-1])
    return None


def grade(row: Mapping[str, Any], result: Mapping[str, Any]) -> dict[str, Any]:
    """``{"reward", "parsed_answer"}`` of a multiple-choice rollout.

    The text graded is ``result["output_text"]``; the letters allowed are the row's option keys.
    A NeMo Gym MCQA row gets ``{"reward", "extracted_answer"}`` instead.

    Example:
        >>> grade({"options": {"A": "3", "B": "4"}, "answer": "B"},
        ...       {"output_text": "The answer is (B)."})
        {'reward': 1.0, 'parsed_answer': 'B'}
    """
    text = result.get("output_text")
    if is_mcqa_row(row):
        return grade_mcqa(row, text if isinstance(text, str) else "")
    options = row.get("options")
    letters = "".join(str(k) for k in options) if isinstance(options, Mapping) else _LETTERS
    parsed = parse_answer(text, letters) if isinstance(text, str) else None
    expected = row.get("answer")
    if expected is None:
        return {"reward": None, "parsed_answer": parsed}
    return {"reward": 1.0 if parsed == str(expected) else 0.0, "parsed_answer": parsed}
