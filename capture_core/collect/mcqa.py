"""NeMo Gym's multiple-choice grading, re-stated: rows, answer extraction, reward.

A NeMo Gym MCQA row carries ``options`` as a list of one-letter objects
(``[{"A": "Karyotyping"}, {"B": "PCR"}]``), the gold letter in ``expected_answer`` and,
optionally, ``grading_mode`` and ``template_metadata.output_regex``. The answer letter is taken
from the assistant's text by, in order of priority:

* ``template_metadata.output_regex`` (case-insensitive, the last match's first group), when it
  compiles;
* ``grading_mode``:

  - ``strict_single_letter_boxed`` (default): the last ``\\boxed{...}``, a ``\\text{...}``
    wrapper removed, holding one upper-case letter with only non-letters around it, or the
    letter followed by ``:``, ``)``, ``.`` or ``-`` and option text;
  - ``lenient_boxed``: strict first, else the one option whose text (lower-cased, spaces
    collapsed) occurs in the last box;
  - ``lenient_answer_colon``: what follows ``Answer:``, as a letter or an option's exact text.

The letter must be one of the options'. The result has NeMo Gym's shape: ``reward`` (1.0 when
the letter is the expected one, else 0.0) and ``extracted_answer`` (the letter, or null).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

__all__ = [
    "GRADING_MODES",
    "check_mcqa_row",
    "extract_answer",
    "grade_mcqa",
    "is_mcqa_row",
    "option_pairs",
]

GRADING_MODES: Final = ("strict_single_letter_boxed", "lenient_boxed", "lenient_answer_colon")
_BOX: Final = re.compile(r"\\boxed\{((?:[^{}]|\{[^{}]*\})*)\}", re.S)
_TEXT_WRAPPER: Final = re.compile(r"\\text\{\s*(.*?)\s*\}", re.S)
_BOXED_LETTER: Final = re.compile(r"[^A-Za-z]*([A-Z])(?:[^A-Za-z]*|\s*[:).\-].*)", re.S)
_ANSWER_COLON: Final = re.compile(r"(?i)answer\s*:\s*(.+)")


def option_pairs(options: object) -> list[tuple[str, str]]:
    """``(letter, text)`` of options given as an object or as NeMo Gym's list of objects.

    Example:
        >>> option_pairs([{"A": "Circle"}, {"B": "Square"}])
        [('A', 'Circle'), ('B', 'Square')]
    """
    if isinstance(options, Mapping):
        return [(str(k), str(v)) for k, v in options.items()]
    pairs: list[tuple[str, str]] = []
    for entry in options if isinstance(options, list) else ():
        if isinstance(entry, Mapping) and len(entry) == 1:
            ((letter, text),) = entry.items()
            pairs.append((str(letter), str(text)))
    return pairs


def is_mcqa_row(row: Mapping[str, Any]) -> bool:
    """Whether a row is in NeMo Gym's MCQA shape (``options`` list and ``expected_answer``)."""
    return isinstance(row.get("options"), list) and "expected_answer" in row


def check_mcqa_row(row: Mapping[str, Any]) -> str | None:
    """Why an MCQA row cannot be graded, or None when it can.

    Example:
        >>> check_mcqa_row({"options": [{"A": "x"}], "expected_answer": "B"})
        "expected_answer 'B' is not one of the options' letters (A)"
    """
    options = row["options"]
    pairs = option_pairs(options)
    if len(pairs) != len(options) or not pairs:
        return 'options must be a non-empty list of one-key objects such as {"A": "text"}'
    letters = [letter for letter, _ in pairs]
    if not all(len(letter) == 1 and letter.isalpha() for letter in letters):
        return f"every option key must be a single letter, got {letters}"
    expected = row.get("expected_answer")
    if not isinstance(expected, str) or expected.strip().upper() not in letters:
        return (f"expected_answer {expected!r} is not one of the options' letters "
                f"({', '.join(letters)})")  # fmt: skip
    mode = row.get("grading_mode", GRADING_MODES[0])
    if mode not in GRADING_MODES:
        return f"grading_mode {mode!r} is not one of {', '.join(GRADING_MODES)}"
    return None


def extract_answer(
    text: str,
    options: list[tuple[str, str]],
    *,
    grading_mode: str = GRADING_MODES[0],
    output_regex: str | None = None,
) -> str | None:
    """The option letter ``text`` answers with, or None.

    Example:
        >>> extract_answer(r"So: \\boxed{\\text{B}}", [("A", "x"), ("B", "y")])
        'B'
    """
    letters = {letter.upper() for letter, _ in options}
    if output_regex:
        try:
            found = re.findall(output_regex, text, flags=re.IGNORECASE)
        except re.error:
            found = None  # an unusable pattern falls back to the grading mode
        if found is not None:
            last = found[-1] if found else None
            letter = (last[0] if isinstance(last, tuple) else last or "").strip().upper()
            return letter if letter in letters else None
    if grading_mode == "lenient_answer_colon":
        return _answer_colon(text, options, letters)
    letter = _strict_boxed(text, letters)
    if letter is None and grading_mode == "lenient_boxed":
        letter = _boxed_option_text(text, options)
    return letter


def grade_mcqa(row: Mapping[str, Any], text: str) -> dict[str, Any]:
    """``{"reward", "extracted_answer"}`` of a NeMo Gym MCQA row answered with ``text``.

    Example:
        >>> grade_mcqa({"options": [{"A": "x"}, {"B": "y"}], "expected_answer": "b"},
        ...            r"The answer is \\boxed{B}.")
        {'reward': 1.0, 'extracted_answer': 'B'}
    """
    template = row.get("template_metadata")
    regex = template.get("output_regex") if isinstance(template, Mapping) else None
    mode = row.get("grading_mode") or GRADING_MODES[0]
    letter = extract_answer(text, option_pairs(row.get("options")), grading_mode=str(mode),
                            output_regex=regex if isinstance(regex, str) else None)  # fmt: skip
    gold = str(row.get("expected_answer") or "").strip().upper()
    return {"reward": 1.0 if letter is not None and letter == gold else 0.0,
            "extracted_answer": letter}  # fmt: skip


def _normal(text: str) -> str:
    return " ".join(text.lower().split())


def _unwrap(text: str) -> str:
    while (match := _TEXT_WRAPPER.fullmatch(text)) is not None:
        text = match.group(1)
    return text


def _last_box(text: str) -> str | None:
    boxes = _BOX.findall(text)
    return _unwrap(boxes[-1].strip()) if boxes else None


def _strict_boxed(text: str, letters: set[str]) -> str | None:
    inner = _last_box(text)
    match = _BOXED_LETTER.fullmatch(inner) if inner is not None else None
    return match.group(1) if match is not None and match.group(1) in letters else None


def _boxed_option_text(text: str, options: list[tuple[str, str]]) -> str | None:
    inner = _last_box(text)
    if inner is None:
        return None
    boxed = _normal(inner)
    wanted = [(letter.upper(), _normal(option)) for letter, option in options]
    matched = {letter for letter, option in wanted if option and option in boxed}
    return matched.pop() if len(matched) == 1 else None


def _answer_colon(text: str, options: list[tuple[str, str]], letters: set[str]) -> str | None:
    match = _ANSWER_COLON.search(text)
    if match is None:
        return None
    candidate = _unwrap(match.group(1).strip()).strip()
    if len(candidate) == 1 and candidate.upper() in letters:
        return candidate.upper()
    wanted = _normal(candidate)
    for letter, option in options:
        if _normal(option) == wanted:
            return letter.upper()
    return None
