"""NeMo Gym ``responses_create_params`` translated to Anthropic Messages: each mapping, each
refusal, and the agent refusing the dialect's row before any call."""

from __future__ import annotations

from typing import Any

import pytest

from capture_core.collect import (
    DEFAULT_MAX_TOKENS,
    CollectError,
    SimpleAgent,
    TaskRequest,
    TaskRowError,
    messages_request,
    task_request,
)

USER = {"role": "user", "content": "Hi"}


def translate(*items: dict[str, Any], **params: Any) -> Any:
    return messages_request(TaskRequest(input=list(items) or [USER], params=params))


def test_a_string_input_becomes_one_user_message_with_the_default_max_tokens() -> None:
    done = messages_request(task_request({"responses_create_params": {"input": "Hi"}}))
    assert (done.system, done.messages, done.tools, done.params) == (None, [USER], [], {})
    assert done.max_tokens == DEFAULT_MAX_TOKENS == 4096


def test_instructions_and_system_messages_become_system_in_order() -> None:
    done = translate(
        {"role": "system", "content": "Be brief."},
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "No"},
                                                              {"type": "input_text", "text": "lists."}]},
        USER,
        instructions="You are a tutor.",
    )  # fmt: skip
    assert done.system == "You are a tutor.\n\nBe brief.\n\nNo\nlists."
    assert done.messages == [USER]


def test_sampling_params_and_max_output_tokens() -> None:
    done = translate(max_output_tokens=64, temperature=0.0, top_p=0.9)
    assert (done.max_tokens, done.params) == (64, {"temperature": 0.0, "top_p": 0.9})


def test_content_parts_become_blocks() -> None:
    done = translate({"role": "user", "content": [
        {"type": "input_text", "text": "Look:"},
        {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0K"},
        {"type": "input_image", "image_url": "https://example.com/a.png", "detail": "low"},
    ]})  # fmt: skip
    assert done.messages == [{"role": "user", "content": [
        {"type": "text", "text": "Look:"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                     "data": "iVBORw0K"}},
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}},
    ]}]  # fmt: skip


def test_tool_calls_and_outputs_become_tool_use_and_tool_result_merged_by_role() -> None:
    done = translate(
        USER,
        {"role": "assistant", "content": [{"type": "output_text", "text": "Let me see."}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2",
         "output": [{"type": "input_text", "text": "two"}]},
        {"type": "message", "role": "assistant", "content": "ok"},
    )  # fmt: skip
    assert done.messages == [
        USER,
        {"role": "assistant", "content": [
            {"type": "text", "text": "Let me see."},
            {"type": "tool_use", "id": "c1", "name": "f", "input": {"x": 1}},
            {"type": "tool_use", "id": "c2", "name": "g", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "c1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "c2", "content": "two"}]},
        {"role": "assistant", "content": "ok"},
    ]  # fmt: skip


def test_function_tools_get_an_input_schema() -> None:
    schema = {"type": "object", "properties": {"q": {"type": "string"}}}
    request = TaskRequest(input=[USER], tools=[
        {"type": "function", "name": "lookup", "description": "Look up.", "parameters": schema,
         "strict": True},
        {"type": "function", "name": "now", "parameters": None},
    ])  # fmt: skip
    assert messages_request(request).tools == [
        {"name": "lookup", "input_schema": schema, "description": "Look up.", "strict": True},
        {"name": "now", "input_schema": {"type": "object"}},
    ]


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        ({"tool_choice": "auto"}, {"type": "auto"}),
        ({"tool_choice": "none"}, {"type": "none"}),
        ({"tool_choice": "required"}, {"type": "any"}),
        ({"tool_choice": {"type": "function", "name": "f"}}, {"type": "tool", "name": "f"}),
        ({"parallel_tool_calls": False}, {"type": "auto", "disable_parallel_tool_use": True}),
        ({"tool_choice": "required", "parallel_tool_calls": False},
         {"type": "any", "disable_parallel_tool_use": True}),
        ({"parallel_tool_calls": True}, None),  # the Messages default
    ],
)  # fmt: skip
def test_tool_choice(params: dict[str, Any], expected: dict[str, Any] | None) -> None:
    assert translate(**params).params.get("tool_choice") == expected


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (TaskRequest(input=[USER], params={"previous_response_id": "resp_1"}),
         "previous_response_id has no Anthropic Messages equivalent"),
        (TaskRequest(input=[USER], params={"reasoning": {"effort": "low"}}), "reasoning has no"),
        (TaskRequest(input=[USER], params={"metadata": {"a": "b"}}), "metadata has no"),
        (TaskRequest(input=[USER], params={"max_output_tokens": 0}), "positive integer"),
        (TaskRequest(input=[USER], params={"tool_choice": {"type": "web_search_preview"}}),
         "tool_choice"),
        (TaskRequest(input=[USER], params={"parallel_tool_calls": "yes"}), "true or false"),
        (TaskRequest(input=[USER], tools=[{"type": "web_search_preview"}]), "only function tools"),
        (TaskRequest(input=[USER], tools=[{"type": "mcp", "server_label": "x"}]), "'mcp'"),
        (TaskRequest(input=[{"type": "reasoning", "summary": []}]), "type 'reasoning'"),
        (TaskRequest(input=[{"role": "tool", "content": "x"}]), "role 'tool'"),
        (TaskRequest(input=[{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]),
         "'input_file'"),
        (TaskRequest(input=[{"role": "user", "content": [{"type": "input_image", "file_id": "f"}]}]),
         "'input_image'"),
        (TaskRequest(input=[{"role": "user", "content": [{"type": "input_audio"}]}]), "'input_audio'"),
        (TaskRequest(input=[{"role": "user", "content": 3}]), "content must be a string or a list"),
        (TaskRequest(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]),
         "arguments must be a JSON object"),
        (TaskRequest(input=[{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{"}]),
         "arguments must be a JSON object"),
        (TaskRequest(input=[{"type": "function_call_output", "call_id": "c",
                             "output": [{"type": "input_image", "image_url": "data:image/png;base64,AA"}]}]),
         "must be text"),
        (TaskRequest(input=[{"role": "system", "content": "Only a system prompt."}]),
         "no user or assistant message"),
    ],
)  # fmt: skip
def test_what_has_no_messages_equivalent_is_refused(request_: TaskRequest, reason: str) -> None:
    with pytest.raises(TaskRowError) as raised:
        messages_request(request_)
    assert reason in str(raised.value)


def test_the_agent_refuses_an_untranslatable_row_before_any_call() -> None:
    # Nothing listens on port 9: a call would fail with a connection error, not TaskRowError.
    agent = SimpleAgent("http://127.0.0.1:9", dialect="messages", timeout_s=1)
    row = {"responses_create_params": {"input": "Hi", "previous_response_id": "resp_1"}}
    with pytest.raises(TaskRowError, match="previous_response_id"):
        agent.run(row, "0-0")
    with pytest.raises(CollectError, match="responses, chat, messages"):
        SimpleAgent("http://127.0.0.1:9", dialect="anthropic")  # type: ignore[arg-type]
