"""Test doubles and builders for capture, shipped so users can test their own code with them.

* :class:`Answer` / :class:`ToolCallSpec`: what a model said and what it cost.
* ``*_body`` / ``*_stream``: that answer as each API sends it, non-streaming or as SSE.
* :func:`capture_line`: the raw capture line the server writes for such a call;
  :class:`CaptureLineFactory` makes many varied, realistic lines from a seed.
* :class:`InMemoryStagingSink` / :class:`LegacyStagingSink`: token-staging sinks for tests
  (the second takes no ``attachments`` keyword, like a pre-attachments sink).
* :class:`SimulatedWorker`: an OpenAI/Anthropic-compatible inference worker (ASGI app) with
  per-request fault injection (``x-ngcapture-fault``), deterministic for a seed.
* :func:`write_run` / :class:`RunSpec`: a synthetic run on disk (capture store + rollout
  JSONL with rewards), tasks stable across runs so checkpoint pairs have known shifts.
* ``run_worker`` / ``run_capture_server`` (in ``capture_core.testing.processes``): both as real
  processes on loopback.

Everything here is deterministic: the same inputs give byte-identical output.
"""

from capture_core.testing._worker_faults import SimulatedDrop
from capture_core.testing.answers import (
    DEFAULT_MODEL,
    Answer,
    ToolCallSpec,
    error_body,
    pieces,
    request_body,
)
from capture_core.testing.bodies import chat_body, messages_body, response_body, responses_body
from capture_core.testing.lines import DIALECT_NAMES, CaptureLineFactory, capture_line, torn
from capture_core.testing.runs import RunSpec, SyntheticRun, write_run
from capture_core.testing.staging import InMemoryStagingSink, LegacyStagingSink
from capture_core.testing.streams import (
    chat_stream,
    messages_stream,
    response_stream,
    responses_stream,
)
from capture_core.testing.worker import SimulatedWorker, WorkerConfig

__all__ = [
    "DEFAULT_MODEL",
    "DIALECT_NAMES",
    "Answer",
    "CaptureLineFactory",
    "InMemoryStagingSink",
    "LegacyStagingSink",
    "RunSpec",
    "SimulatedDrop",
    "SimulatedWorker",
    "SyntheticRun",
    "ToolCallSpec",
    "WorkerConfig",
    "capture_line",
    "chat_body",
    "chat_stream",
    "error_body",
    "messages_body",
    "messages_stream",
    "pieces",
    "request_body",
    "response_body",
    "response_stream",
    "responses_body",
    "responses_stream",
    "torn",
    "write_run",
]
