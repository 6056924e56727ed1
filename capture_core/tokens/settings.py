"""The ``token_id_capture`` settings block, the sink and source it selects, and process-level
installation.

A run's global config carries::

    model_call_capture_dir: /abs/model-calls      # the fallback directory
    token_id_capture:
      enabled: true
      all_agents: false                # or opt agents in one by one
      dir: /abs/token-capture          # the file store (default: model_call_capture_dir)
      sink: my_pkg.sinks:RemoteSink    # or a sink of your own, built in every server process
      sink_kwargs: {endpoint: ...}
      rebuild_response: true           # the collector freezes and rebuilds response.output
      max_mask_fraction: 0.05          # abort once more than 5% of finalized rollouts ...
      mask_fraction_min_samples: 50    # ... are masked, counted from 50 finalized on

Unknown keys (a typo such as ``dirr``) are refused at start-up, naming the key. A disabled block
is kept as written and not checked, so templated configs can carry it switched off.

Where entries go, in a model-server process (:func:`resolve_token_sink`): the configured
``sink`` (built per process), else a sink installed with :func:`install_token_sink`, else the
file store on the resolved directory. Where the collector reads them
(:func:`resolve_token_source`): an installed source, else the file store. Installation is
per process: a sink installed by a launcher does not reach workers it spawns.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, Self

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from capture_core.exceptions import TokenCaptureConfigError
from capture_core.tokens.protocols import TokenSink, TokenSource
from capture_core.tokens.store import TokenCaptureStore

__all__ = [
    "TOKEN_ID_CAPTURE_KEY",
    "TokenIdCaptureConfig",
    "TokenIdCaptureSettings",
    "build_token_sink",
    "install_token_sink",
    "install_token_source",
    "installed_token_sink",
    "installed_token_source",
    "load_token_capture_config",
    "make_token_store",
    "resolve_token_sink",
    "resolve_token_source",
    "token_id_capture_dirs",
    "token_id_capture_enabled_for_agent",
]

logger = logging.getLogger("capture_core.tokens")

TOKEN_ID_CAPTURE_KEY: Final = "token_id_capture"
_SINK_MEMBERS: Final = ("put", "mark_incomplete", "close")
_installed_sink: TokenSink | None = None
_installed_source: TokenSource | None = None


class TokenIdCaptureSettings(BaseModel):
    """The ``token_id_capture`` block.

    Attributes:
        enabled: the run-level switch.
        all_agents: every agent takes part, whatever its own ``token_id_capture`` flag.
        dir: the file store's directory (absolute); default: ``model_call_capture_dir``.
        sink: ``"module.path:ClassName"`` of a :class:`TokenSink` built in every model-server
            process; it replaces the file store.
        sink_kwargs: keyword arguments for the sink's constructor.
        rebuild_response: the collector freezes each rollout and rebuilds ``response.output``
            from its entries (off: an external framework consumes the entries).
        max_mask_fraction: abort the run when more than this fraction of finalized rollouts
            is masked (``None``: never); between 0 and 1.
        mask_fraction_min_samples: finalized rollouts needed before the abort check applies
            (at least 1).

    Example:
        >>> TokenIdCaptureSettings(enabled=True, dir="/abs/tokens").mask_fraction_min_samples
        50
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = False
    all_agents: bool = False
    dir: Path | None = None
    sink: str | None = None
    sink_kwargs: dict[str, Any] = Field(default_factory=dict)
    rebuild_response: bool = True
    max_mask_fraction: float | None = Field(default=None, ge=0.0, le=1.0, allow_inf_nan=False)
    mask_fraction_min_samples: int = Field(default=50, ge=1)


class TokenIdCaptureConfig(BaseModel):
    """The parts of a global config token-id capture reads (other keys are ignored).

    Checked only when the block is enabled: a configured ``sink`` wins (a ``dir`` beside it is
    logged as unused); otherwise a directory is required, unless a sink is installed in this
    process or ``rebuild_response`` is off, and it must be absolute.

    Example:
        >>> config = TokenIdCaptureConfig.from_global_config(
        ...     {"model_call_capture_dir": "/abs/mc", "token_id_capture": {"enabled": True}})
        >>> config.resolved_dir
        PosixPath('/abs/mc')
    """

    model_config = ConfigDict(extra="ignore")

    token_id_capture: TokenIdCaptureSettings = Field(default_factory=TokenIdCaptureSettings)
    model_call_capture_dir: Path | None = None

    @classmethod
    def from_global_config(cls, config: Mapping[str, Any]) -> TokenIdCaptureConfig:
        """Read and check the block from a global config mapping.

        Raises:
            TokenCaptureConfigError: ``.key`` names the setting at fault, e.g.
                ``token_id_capture.dirr`` for an unknown key.
        """
        try:
            return cls.model_validate(dict(config))
        except ValidationError as exc:
            error = exc.errors()[0]
            key = ".".join(str(part) for part in error["loc"]) or TOKEN_ID_CAPTURE_KEY
            reason = str(error["msg"]).removeprefix("Value error, ")
            raise TokenCaptureConfigError(key, reason) from exc

    @property
    def settings(self) -> TokenIdCaptureSettings:
        """The ``token_id_capture`` block."""
        return self.token_id_capture

    @property
    def resolved_dir(self) -> Path | None:
        """The file store's directory: ``dir``, else ``model_call_capture_dir``."""
        return self.token_id_capture.dir or self.model_call_capture_dir

    @model_validator(mode="after")
    def _check_when_enabled(self) -> Self:
        block = self.token_id_capture
        if not block.enabled:
            return self
        if block.sink is not None:
            if block.dir is not None:
                logger.warning(
                    "token_id_capture.dir %s will not be written to: token_id_capture.sink %s "
                    "replaces the file store",
                    block.dir,
                    block.sink,
                )
            return self
        directory = self.resolved_dir
        if directory is None:
            if installed_token_sink() is not None or not block.rebuild_response:
                return self
            raise ValueError(
                "token_id_capture requires a directory or sink (set token_id_capture.dir or "
                "model_call_capture_dir to an absolute path, or token_id_capture.sink)"
            )
        if not directory.is_absolute():
            raise ValueError(
                f"the token_id_capture directory must be an absolute path, got {str(directory)!r}"
            )
        return self


def load_token_capture_config(
    path: str | os.PathLike[str], *, model_call_capture_dir: str | os.PathLike[str] | None = None
) -> TokenIdCaptureConfig:
    """Read a run's token-capture config from a JSON file (``ngcapture serve`` and
    ``ngcapture collect --token-id-capture-config``).

    The file is a global config object: it must hold a ``token_id_capture`` block, may hold
    ``model_call_capture_dir`` (the block's fallback directory) and may hold anything else (a
    whole run config), which is ignored. ``model_call_capture_dir`` given here is the fallback
    when the file has none (the server's capture directory, the collector's first one).

    Raises:
        TokenCaptureConfigError: the file cannot be read, is not a JSON object, has no
            ``token_id_capture`` block, or the block is invalid (``.key`` names the setting,
            e.g. ``token_id_capture.dirr`` for an unknown key).

    Example:
        >>> load_token_capture_config("run.json").settings.enabled  # doctest: +SKIP
        True
    """
    where = Path(path)
    try:
        data = orjson.loads(where.read_bytes())
    except OSError as exc:
        raise TokenCaptureConfigError(
            TOKEN_ID_CAPTURE_KEY, f"cannot read {where}: {exc.strerror or exc}"
        ) from exc
    except orjson.JSONDecodeError as exc:
        raise TokenCaptureConfigError(
            TOKEN_ID_CAPTURE_KEY, f"{where} is not valid JSON: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise TokenCaptureConfigError(
            TOKEN_ID_CAPTURE_KEY, f"{where} must hold a JSON object, not {type(data).__name__}"
        )
    if TOKEN_ID_CAPTURE_KEY not in data:
        raise TokenCaptureConfigError(
            TOKEN_ID_CAPTURE_KEY, f"{where} has no {TOKEN_ID_CAPTURE_KEY!r} block"
        )
    if data.get("model_call_capture_dir") is None and model_call_capture_dir is not None:
        data["model_call_capture_dir"] = str(model_call_capture_dir)
    try:
        return TokenIdCaptureConfig.from_global_config(data)
    except TokenCaptureConfigError as exc:
        raise TokenCaptureConfigError(exc.key, f"{exc.reason} (in {where})") from exc


def token_id_capture_dirs(config: TokenIdCaptureConfig) -> list[Path]:
    """The file store's directory as a list: empty when off, when a sink replaces the store, or
    when there is none.

    Example:
        >>> token_id_capture_dirs(TokenIdCaptureConfig())
        []
    """
    block = config.token_id_capture
    if not block.enabled or block.sink is not None or config.resolved_dir is None:
        return []
    return [config.resolved_dir]


def make_token_store(
    config: TokenIdCaptureConfig, *, create: bool = True
) -> TokenCaptureStore | None:
    """The file store on :func:`token_id_capture_dirs`, or ``None``.

    Args:
        config: the run's config.
        create: create the directory (model servers); the collector passes ``False``.

    Raises:
        CaptureDirNotFoundError: ``create`` is false and the directory does not exist.
    """
    dirs = token_id_capture_dirs(config)
    return TokenCaptureStore(dirs[0], create=create) if dirs else None


def build_token_sink(config: TokenIdCaptureConfig) -> TokenSink | None:
    """Build the configured ``sink``; ``None`` unless the block is enabled and names one.

    Raises:
        TokenCaptureConfigError: the target is not ``module.path:ClassName``, cannot be
            imported, cannot be built with ``sink_kwargs`` (``.key == "sink_kwargs"``), or the
            object lacks an ``async`` ``put``, ``mark_incomplete`` or ``close``.

    Example:
        >>> build_token_sink(TokenIdCaptureConfig()) is None
        True
    """
    block = config.token_id_capture
    if not block.enabled or block.sink is None:
        return None
    target = block.sink
    module_name, colon, class_name = target.partition(":")
    if not colon or not module_name or not class_name:
        raise TokenCaptureConfigError("sink", f"{target!r} must be 'module.path:ClassName'")
    try:
        factory = getattr(importlib.import_module(module_name), class_name)
    except (ImportError, AttributeError) as exc:
        raise TokenCaptureConfigError("sink", f"could not load {target!r}: {exc}") from exc
    try:
        sink = factory(**block.sink_kwargs)
    except TypeError as exc:
        raise TokenCaptureConfigError(
            "sink_kwargs", f"{target!r} does not accept sink_kwargs {block.sink_kwargs!r}: {exc}"
        ) from exc
    except Exception as exc:
        raise TokenCaptureConfigError("sink", f"constructing {target!r} failed: {exc}") from exc
    problems = []
    for name in _SINK_MEMBERS:
        member = getattr(sink, name, None)
        if not callable(member):
            problems.append(name)
        elif not inspect.iscoroutinefunction(member):
            problems.append(f"{name} (not async)")
    if problems or not isinstance(sink, TokenSink):
        raise TokenCaptureConfigError(
            "sink", f"{target!r} does not satisfy TokenSink: {', '.join(problems)}"
        )
    return sink


def resolve_token_sink(config: TokenIdCaptureConfig) -> TokenSink | None:
    """The sink a model-server process writes to: configured, else installed, else the file
    store; ``None`` when the block is off or there is no destination (external staging).

    Raises:
        TokenCaptureConfigError: as :func:`build_token_sink`.
    """
    if not config.token_id_capture.enabled:
        return None
    return build_token_sink(config) or installed_token_sink() or make_token_store(config)


def resolve_token_source(config: TokenIdCaptureConfig) -> TokenSource | None:
    """The source the collector freezes rollouts through: an installed source, else the file
    store (which must exist: the collector never creates it); ``None`` when the block is off
    or ``rebuild_response`` is off.

    Raises:
        CaptureDirNotFoundError: the file store's directory does not exist.
    """
    block = config.token_id_capture
    if not block.enabled or not block.rebuild_response:
        return None
    return installed_token_source() or make_token_store(config, create=False)


def token_id_capture_enabled_for_agent(global_config: Mapping[str, Any], agent_name: str) -> bool:
    """Whether an agent takes part: the block is enabled and either ``all_agents`` is set or
    one of ``global_config[agent_name]["responses_api_agents"]`` has a truthy
    ``token_id_capture``.

    Raises:
        TokenCaptureConfigError: the block is invalid.

    Example:
        >>> token_id_capture_enabled_for_agent(
        ...     {"token_id_capture": {"enabled": True, "all_agents": True, "dir": "/abs/t"}}, "a")
        True
    """
    config = TokenIdCaptureConfig.from_global_config(global_config)
    block = config.token_id_capture
    if not block.enabled:
        return False
    if block.all_agents:
        return True
    agent = global_config.get(agent_name)
    agents = agent.get("responses_api_agents") if isinstance(agent, Mapping) else None
    if not isinstance(agents, Mapping):
        return False
    return any(
        isinstance(entry, Mapping) and bool(entry.get(TOKEN_ID_CAPTURE_KEY))
        for entry in agents.values()
    )


def install_token_sink(sink: TokenSink | None) -> None:
    """Install (or with ``None`` remove) this process's programmatic sink."""
    global _installed_sink  # noqa: PLW0603 - the process-level slot is the point
    _installed_sink = sink


def installed_token_sink() -> TokenSink | None:
    """This process's programmatically installed sink, if any."""
    return _installed_sink


def install_token_source(source: TokenSource | None) -> None:
    """Install (or with ``None`` remove) this process's source; it is never closed for you."""
    global _installed_source  # noqa: PLW0603 - the process-level slot is the point
    _installed_source = source


def installed_token_source() -> TokenSource | None:
    """This process's installed source, if any."""
    return _installed_source
