"""Task rows (NeMo Gym ``responses_create_params``, MCQA, prompts) and NeMo Gym MCQA grading."""

from __future__ import annotations

from typing import Any

import pytest

from capture_core.collect import (
    TaskRequest,
    TaskRowError,
    chat_request,
    extract_answer,
    grade,
    task_request,
)
from capture_core.collect.tools import execute_tool

OPTIONS = [{"A": "Karyotyping"}, {"B": "Polymerase Chain Reaction (PCR)"}, {"C": "Circle"}]
PAIRS = [("A", "Karyotyping"), ("B", "Polymerase Chain Reaction (PCR)"), ("C", "Circle")]


def nemo_row(**extra: Any) -> dict[str, Any]:
    params = {"input": [{"role": "user", "content": "Which test? A: ... B: ... C: ..."}],
              "temperature": 0.0, "max_output_tokens": None, "tools": [], "stream": None}  # fmt: skip
    return {"responses_create_params": params, "options": OPTIONS, "expected_answer": "B",
            "uuid": "u-1", **extra}  # fmt: skip


def test_a_nemo_gym_row_is_its_own_request() -> None:
    request = task_request(nemo_row())
    assert request.kind == "responses_create_params"
    assert request.input == [{"role": "user", "content": "Which test? A: ... B: ... C: ..."}]
    assert request.params == {"temperature": 0.0}  # nulls dropped, tools taken apart
    assert (request.tools, request.model, request.question) == (
        [],
        None,
        request.input[0]["content"],
    )
    text = task_request({"responses_create_params": {"input": "Hi", "model": "m", "stream": True,
                                                     "instructions": "Be brief."}})  # fmt: skip
    assert (text.input, text.model, text.params) == (
        [{"role": "user", "content": "Hi"}], "m", {"instructions": "Be brief."})  # fmt: skip


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        ({"responses_create_params": [1]}, "responses_create_params must be a JSON object, got a list"),
        ({"responses_create_params": {}}, "responses_create_params has no 'input'"),
        ({"responses_create_params": {"input": ""}}, "input is an empty string"),
        ({"responses_create_params": {"input": 7}}, "got int"),
        ({"responses_create_params": {"input": []}}, "non-empty list"),
        ({"responses_create_params": {"input": [{"content": "x"}]}}, "input[0] is not an input item"),
        ({"responses_create_params": {"input": "x", "tools": {"a": 1}}}, "tools must be a list"),
        ({"responses_create_params": {"input": "x", "model": 3}}, "model must be a string"),
        (nemo_row(expected_answer="E"), "expected_answer 'E' is not one of the options' letters (A, B, C)"),
        (nemo_row(options=[{"A": "x", "B": "y"}]), "one-key objects"),
        (nemo_row(options=[{"AB": "x"}]), "single letter"),
        (nemo_row(grading_mode="vibes"), "grading_mode 'vibes' is not one of"),
        ({"question": "q"}, "needs 'responses_create_params'"),
        ({"id": 3}, "needs 'responses_create_params'"),
    ],
)  # fmt: skip
def test_an_unusable_row_says_why(row: dict[str, Any], reason: str) -> None:
    with pytest.raises(TaskRowError) as raised:
        task_request(row)
    assert reason in str(raised.value)


def test_multiple_choice_and_prompt_rows() -> None:
    request = task_request({"question": "2+2?", "options": [{"A": "3"}, {"B": "4"}]})
    assert request.kind == "question" and "(B) 4" in request.question
    assert task_request({"prompt": "Say hi."}).input == [{"role": "user", "content": "Say hi."}]


def test_chat_translation_and_what_it_refuses() -> None:
    request = TaskRequest(
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Look:"},
                                            {"type": "input_image", "image_url": "data:x",
                                             "detail": "low"}]},
               {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
               {"type": "function_call_output", "call_id": "c1", "output": "done"},
               {"type": "message", "role": "assistant", "content": "ok"}],
        params={"instructions": "Be brief.", "max_output_tokens": 9, "temperature": 0.5},
        tools=[{"type": "function", "name": "f", "parameters": {"type": "object"}}],
    )  # fmt: skip
    chat = chat_request(request)
    assert chat.messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Look:"},
                                     {"type": "image_url", "image_url": {"url": "data:x", "detail": "low"}}]},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "done"},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip
    assert chat.params == {"max_completion_tokens": 9, "temperature": 0.5}
    assert chat.tools == [
        {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    ]
    for bad, reason in [
        (TaskRequest(input=[{"role": "user", "content": "x"}], params={"reasoning": {}}), "reasoning has no"),
        (TaskRequest(input=[{"type": "reasoning", "summary": []}]), "type 'reasoning'"),
        (TaskRequest(input=[{"role": "user", "content": [{"type": "input_file"}]}]), "'input_file'"),
        (TaskRequest(input=[{"role": "user", "content": "x"}], tools=[{"type": "web_search"}]), "only function tools"),
    ]:  # fmt: skip
        with pytest.raises(TaskRowError, match=reason):
            chat_request(bad)


@pytest.mark.parametrize(
    ("text", "mode", "regex", "expected"),
    [
        (r"Final: \boxed{ [C] }", "strict_single_letter_boxed", None, "C"),
        (r"\boxed{C} then \boxed{B}", "strict_single_letter_boxed", None, "B"),  # the last box
        (r"\boxed{\text{B}}", "strict_single_letter_boxed", None, "B"),
        (r"\boxed{\text{B: Polymerase...}}", "strict_single_letter_boxed", None, "B"),
        (r"\boxed{B) PCR}", "strict_single_letter_boxed", None, "B"),
        (r"\boxed{A polygenic risk score}", "strict_single_letter_boxed", None, None),
        (r"\boxed{b}", "strict_single_letter_boxed", None, None),  # upper case only
        (r"\boxed{E}", "strict_single_letter_boxed", None, None),  # not an option
        ("The answer is (B).", "strict_single_letter_boxed", None, None),
        (r"\boxed{circle}", "lenient_boxed", None, "C"),
        (r"\boxed{ Polymerase  chain reaction (pcr) }", "lenient_boxed", None, "B"),
        ("Answer: b", "lenient_answer_colon", None, "B"),
        ("answer : Karyotyping", "lenient_answer_colon", None, "A"),
        ("Answer: maybe", "lenient_answer_colon", None, None),
        ("ANSWER IS c", "strict_single_letter_boxed", r"ANSWER IS\s*([A-Za-z])", "C"),
        (r"answer is A ... answer is B \boxed{C}", "strict_single_letter_boxed", r"answer is\s*([A-Z])", "B"),
        (r"\boxed{C}", "strict_single_letter_boxed", r"([", "C"),  # a bad pattern falls back
    ],
)  # fmt: skip
def test_answer_extraction(text: str, mode: str, regex: str | None, expected: str | None) -> None:
    assert extract_answer(text, PAIRS, grading_mode=mode, output_regex=regex) == expected


def test_grading_in_nemo_gyms_shape_keeps_the_old_shape_for_old_rows() -> None:
    row = nemo_row(template_metadata={"output_regex": r"pick:\s*([A-Z])"})
    assert grade(row, {"output_text": "pick: B"}) == {"reward": 1.0, "extracted_answer": "B"}
    assert grade(nemo_row(), {"output_text": r"\boxed{A}"}) == {
        "reward": 0.0,
        "extracted_answer": "A",
    }
    assert grade(nemo_row(), {}) == {"reward": 0.0, "extracted_answer": None}
    assert grade({"options": {"A": "3", "B": "4"}, "answer": "B"},
                 {"output_text": "The answer is (B)."}) == {"reward": 1.0, "parsed_answer": "B"}  # fmt: skip


def test_the_executor_times_each_tool_call() -> None:
    done = execute_tool("calculator", '{"expression": "6 * 7"}')
    assert (done.output, done.status, done.error_type) == ("42", "completed", None)
    assert done.started_at <= done.completed_at and done.duration_ms >= 0
    for name, arguments, error in [("nope", "{}", "unknown_tool"), ("lookup", "{", "invalid_arguments"),
                                   ("lookup", "[1]", "invalid_arguments"),
                                   ("lookup", '{"q": 1}', "invalid_arguments"),
                                   ("calculator", '{"expression": "1/0"}', "tool_error")]:  # fmt: skip
        failed = execute_tool(name, arguments)
        assert (failed.status, failed.error_type) == ("failed", error), name
        assert failed.output.startswith("error:")
