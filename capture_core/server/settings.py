"""Capture server settings: one pydantic-settings class, every field an ``NGCAPTURE_*`` variable.

Other entry points than benchmark jobs are opt-in: capture is off unless
``NGCAPTURE_OBSERVABILITY_ENABLED=true``, and then ``NGCAPTURE_MODEL_CALL_CAPTURE_DIR`` must be
an absolute path. :func:`benchmark_capture_settings` gives benchmark jobs their default:
capture on, under ``<job_dir>/model-calls/``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from capture_core.facts_journal import SEGMENT_BYTES
from capture_core.tokens.settings import TokenIdCaptureConfig, load_token_capture_config

__all__ = [
    "DEFAULT_MAX_HEADER_BYTES",
    "CaptureSettings",
    "benchmark_capture_settings",
    "validate_upstream_url",
]

DEFAULT_CAPTURE_SUBDIR: Final = "model-calls"
#: A request line and headers larger than this are refused (431): LLM API requests send a
#: few hundred bytes of headers (nginx allows 32 KiB, Node.js 16 KiB).
DEFAULT_MAX_HEADER_BYTES: Final = 64 * 1024


def validate_upstream_url(url: str) -> str:
    """Check that ``url`` is an ``http(s)`` origin (optionally with a base path); return it.

    Every forwarded request goes to this origin: scheme, host and port come from here, never
    from the request. Credentials, a query or a fragment in the URL are refused.

    Raises:
        ValueError: the URL is not ``http(s)://host[:port][/base-path]``; the message says why.

    Example:
        >>> validate_upstream_url("http://127.0.0.1:8001")
        'http://127.0.0.1:8001'
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https"):
        raise ValueError(f"upstream URL {url!r} must start with http:// or https://")
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"upstream URL {url!r} has an invalid port") from None
    if not parts.hostname:
        raise ValueError(f"upstream URL {url!r} has no host")
    if port == 0:
        raise ValueError(f"upstream URL {url!r} has port 0")
    if parts.username is not None or parts.password is not None:
        raise ValueError(f"upstream URL {url!r} must not carry credentials")
    if parts.query or parts.fragment or url.rstrip().endswith(("?", "#")):
        raise ValueError(f"upstream URL {url!r} must not have a query or fragment")
    if any(c.isspace() for c in url) or any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise ValueError(f"upstream URL {url!r} contains whitespace or control characters")
    return url


class CaptureSettings(BaseSettings):
    """Everything the capture server needs; read from ``NGCAPTURE_*`` environment variables.

    Example:
        >>> CaptureSettings(observability_enabled=True, model_call_capture_dir="/tmp/mc",
        ...                 upstream_url="http://127.0.0.1:8001").capture_dir
        PosixPath('/tmp/mc')
    """

    model_config = SettingsConfigDict(env_prefix="NGCAPTURE_", extra="ignore")

    observability_enabled: bool = False
    model_call_capture_dir: Path | None = None
    upstream_url: str = Field(
        default="http://127.0.0.1:8001", description="base URL of the inference worker"
    )
    upstream_responses_url: str | None = Field(
        default=None, description="override for /v1/responses"
    )
    upstream_chat_url: str | None = Field(default=None, description="override for chat completions")
    upstream_messages_url: str | None = Field(default=None, description="override for /v1/messages")
    model_server_name: str | None = Field(default="policy_model", description="for model_ref")
    connect_timeout_s: float = Field(default=10.0, gt=0)
    read_timeout_s: float = Field(default=600.0, gt=0)
    max_connections: int = Field(
        default=512, ge=1, description="connections kept open to the upstream worker"
    )
    upstream_keepalive_s: float = Field(
        default=4.0,
        gt=0,
        description="how long an idle upstream connection is kept for reuse (below the "
        "worker's own keep-alive timeout, 5 s for uvicorn, so a reused one is never stale)",
    )
    max_request_body_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1,
        description="largest request body accepted; a larger one is answered 413",
    )
    max_header_bytes: int = Field(
        default=DEFAULT_MAX_HEADER_BYTES,
        ge=1024,
        description="largest request line and headers accepted; larger ones are answered 431 "
        "and the connection is closed",
    )
    header_timeout_s: float = Field(
        default=60.0, gt=0, description="time a client has to send a request's headers"
    )
    idle_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="longest silence of a client sending a body, of an idle keep-alive "
        "connection, and of a client that takes nothing of its answer, before it is closed",
    )
    max_client_connections: int = Field(
        default=1024,
        ge=2,
        description="client connections open at once, the new one included; a request that "
        "arrives at the cap gets a 503",
    )
    access_log: bool = Field(default=False, description="log one line per request")
    journal_segment_bytes: int = Field(
        default=SEGMENT_BYTES,
        ge=0,
        description="run `ngcapture compact` on the facts journal (a separate process) each "
        "time it grows by this many bytes, and when the server stops (a journal of at least "
        "1 MiB, or this much, written to since), so a first open reads columns instead of "
        "decoding entries; 0: never",
    )
    summary_interval_s: float = Field(
        default=60.0,
        ge=0,
        description="log a summary of calls, failures and bytes this often (0: never)",
    )
    lineage_dir: Path | None = Field(
        default=None, description="training capture: the directory of the rollout ledgers"
    )
    control_token_env: str = Field(
        default="NGCAPTURE_CONTROL_TOKEN",
        min_length=1,
        description="NAME of the variable holding the control-plane bearer token (not the token)",
    )
    token_id_capture_config: Path | None = Field(
        default=None,
        description="token-id capture: a JSON file with the token_id_capture block (see "
        "docs/token-store.md); needs training capture (lineage_dir)",
    )
    _token_capture: TokenIdCaptureConfig | None = PrivateAttr(default=None)

    @field_validator(
        "upstream_url", "upstream_responses_url", "upstream_chat_url", "upstream_messages_url"
    )
    @classmethod
    def _upstream_origin(cls, value: str | None) -> str | None:
        return None if value is None else validate_upstream_url(value)

    @model_validator(mode="after")
    def _capture_dir_when_enabled(self) -> CaptureSettings:
        if not self.observability_enabled:
            return self
        if self.model_call_capture_dir is None:
            raise ValueError(
                "model_call_capture_dir is required when observability_enabled is true "
                "(set NGCAPTURE_MODEL_CALL_CAPTURE_DIR to an absolute path)"
            )
        if not self.model_call_capture_dir.is_absolute():
            raise ValueError(
                "model_call_capture_dir must be an absolute path, got "
                f"{str(self.model_call_capture_dir)!r}"
            )
        return self

    @model_validator(mode="after")
    def _token_capture_block(self) -> CaptureSettings:
        if self.token_id_capture_config is None:
            return self
        config = load_token_capture_config(
            self.token_id_capture_config, model_call_capture_dir=self.capture_dir
        )
        if config.token_id_capture.enabled and self.lineage_dir is None:
            raise ValueError(
                "token_id_capture is enabled but training capture is off: token ids are asked "
                "of the worker only on the training-capture route, so set lineage_dir "
                "(--lineage-dir, NGCAPTURE_LINEAGE_DIR) too"
            )
        self._token_capture = config
        return self

    @property
    def token_capture(self) -> TokenIdCaptureConfig | None:
        """The token-capture config read from ``token_id_capture_config`` (``None``: none)."""
        return self._token_capture

    @property
    def capture_dir(self) -> Path | None:
        """The capture directory when capture is on, else ``None``."""
        return self.model_call_capture_dir if self.observability_enabled else None

    def upstream_for(self, dialect: str | None) -> str:
        """The upstream base URL serving ``dialect`` (the default one for other paths)."""
        override = {
            "responses": self.upstream_responses_url,
            "chat": self.upstream_chat_url,
            "messages": self.upstream_messages_url,
        }.get(dialect or "")
        return (override or self.upstream_url).rstrip("/")


def benchmark_capture_settings(
    job_dir: str | Path, run: Mapping[str, Any] | None = None, **overrides: Any
) -> CaptureSettings:
    """Capture settings of one benchmark job: on by default, under ``<job_dir>/model-calls``.

    ``run`` is the benchmark's ``run`` block: ``observability_enabled: false`` opts out;
    ``model_call_capture_dir`` moves the directory and must be absolute (a relative one raises
    a ``ValueError`` that says so).

    Example:
        >>> benchmark_capture_settings("/jobs/mcqa").capture_dir
        PosixPath('/jobs/mcqa/model-calls')
    """
    run = run or {}
    enabled = run.get("observability_enabled", True)
    if not isinstance(enabled, bool):
        raise ValueError(f"observability_enabled must be true or false, got {enabled!r}")
    directory = run.get("model_call_capture_dir")
    if directory is None:
        job = Path(job_dir)
        if enabled and not job.is_absolute():
            raise ValueError(f"the job directory must be absolute, got {str(job)!r}")
        directory = job / DEFAULT_CAPTURE_SUBDIR
    elif not Path(directory).is_absolute():
        raise ValueError(f"model_call_capture_dir must be an absolute path, got {str(directory)!r}")
    return CaptureSettings(
        observability_enabled=enabled, model_call_capture_dir=Path(directory), **overrides
    )
