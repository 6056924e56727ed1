"""NeMo Gym's own model server with its capture middleware, as the proxy benchmark's reference.

``nemo-gym`` comes from PyPI into a separate Python 3.13 virtual environment that this module
makes under ``results/bench/gym-venv`` (reused by later runs; ``NGCAPTURE_BENCH_GYM_VENV``
moves it). The version is pinned (``NGCAPTURE_BENCH_GYM_SPEC``, default below): nemo-gym
0.4.0, the newest release that declares support for Python 3.13.0, has no model-call capture;
0.5.0 and later have it but declare ``Requires-Python >=3.13.14``. When only an older 3.13 is
found (pyenv here has 3.13.0), pip is told ``--ignore-requires-python`` and the report says so.

The server run is Gym's ``responses_api_models/openai_model`` (an OpenAI-compatible pass-through
through Gym's aiohttp client), started the way ``ng_run`` starts a server process: its
``app.py`` with the global config in ``NEMO_GYM_CONFIG_DICT`` and the server's name in
``NEMO_GYM_CONFIG_PATH``; the config turns on ``observability_enabled`` with an absolute
``model_call_capture_dir``, so every ``/ng-rollout/<id>/v1/chat/completions`` call appends a line
to ``<dir>/<id>.capture.jsonl``. No head server is started (the model server does not call it).
"""

from __future__ import annotations

import glob
import http.client
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from capture_core.testing.processes import ServiceProcess

GYM_SPEC = os.environ.get("NGCAPTURE_BENCH_GYM_SPEC", "nemo-gym==0.7.0")
GYM_VENV = Path(os.environ.get("NGCAPTURE_BENCH_GYM_VENV", "results/bench/gym-venv"))
GYM_SERVER = "responses_api_models/openai_model"
REQUIRES_PYTHON = (3, 13, 14)  # nemo-gym >= 0.5.0's declared floor
START_TIMEOUT_S = 180.0


@dataclass
class GymEnv:
    python: Path
    version: str
    interpreter: str  # the 3.13 it was made from, e.g. "3.13.0 (~/.pyenv/versions/3.13.0)"
    notes: str  # e.g. that Requires-Python was overridden


def _version(python: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(
            [python, "-c", "import sys; print(*sys.version_info[:3])"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return tuple(int(part) for part in out.stdout.split())


def find_python313() -> tuple[str, tuple[int, ...]] | None:
    """The newest Python 3.13 from pyenv (``~/.pyenv/versions/3.13*``) or ``PATH``."""
    found = []
    pattern = os.path.expanduser("~/.pyenv/versions/3.13*/bin/python3.13")
    explicit = os.environ.get("NGCAPTURE_BENCH_PYTHON313")
    for candidate in [explicit, *glob.glob(pattern), "python3.13"]:
        if candidate and (version := _version(candidate)) and version[:2] == (3, 13):
            found.append((version, candidate))
    if not found:
        return None
    version, python = max(found)
    return python, version


def _installed_version(python: Path) -> str | None:
    """nemo-gym's version in the venv, or None when it lacks the capture middleware."""
    probe = (
        "import importlib.metadata as m, nemo_gym.base_responses_api_model as b;"
        "assert hasattr(b, 'install_model_call_capture'); print(m.version('nemo-gym'))"
    )
    try:
        out = subprocess.run(
            [str(python), "-c", probe], capture_output=True, text=True, timeout=120, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None


def _pip_error(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if not line.startswith("WARNING: Location")]
    return "\n".join(lines[-12:])


def ensure_gym(venv: Path = GYM_VENV) -> GymEnv:
    """Make (or reuse) the Gym venv; raises RuntimeError saying exactly what failed."""
    venv = venv.absolute()  # the server runs from its own directory; keep bin/python a symlink
    stamp, python = venv / ".ngcapture-bench.json", venv / "bin" / "python"
    if stamp.exists() and python.exists():
        cached = json.loads(stamp.read_text())
        if cached.get("spec") == GYM_SPEC and _installed_version(python) == cached["version"]:
            return GymEnv(python, cached["version"], cached["interpreter"], cached["notes"])
    found = find_python313()
    if found is None:
        raise RuntimeError(
            "no Python 3.13 found (looked in ~/.pyenv/versions/3.13*, PATH, "
            "NGCAPTURE_BENCH_PYTHON313)"
        )
    base, version = found
    interpreter = f"{'.'.join(map(str, version))} ({base})"
    print(
        f"proxy: making the NeMo Gym venv {venv} from Python {interpreter} and installing "
        f"{GYM_SPEC} from PyPI (first run only; a few minutes)",
        flush=True,
    )
    subprocess.run(["rm", "-rf", str(venv)], check=True)
    made = subprocess.run(
        [base, "-m", "venv", str(venv)], check=False, capture_output=True, text=True
    )
    if made.returncode:
        raise RuntimeError(f"python -m venv failed: {made.stderr.strip()}")
    args = [str(python), "-m", "pip", "install", "--quiet", GYM_SPEC]
    notes = ""
    if version < REQUIRES_PYTHON:
        args.append("--ignore-requires-python")
        notes = (
            f"nemo-gym >= 0.5.0 declares Requires-Python >=3.13.14; installed on "
            f"{interpreter} with pip --ignore-requires-python"
        )
    installed = subprocess.run(args, check=False, capture_output=True, text=True, timeout=3600)
    if installed.returncode:
        raise RuntimeError(f"pip install {GYM_SPEC} failed:\n{_pip_error(installed.stderr)}")
    gym_version = _installed_version(python)
    if gym_version is None:
        raise RuntimeError(
            f"{GYM_SPEC} installed but nemo_gym has no model-call capture "
            "middleware (install_model_call_capture)"
        )
    stamp.write_text(
        json.dumps(
            {"spec": GYM_SPEC, "version": gym_version, "interpreter": interpreter, "notes": notes}
        )
    )
    return GymEnv(python, gym_version, interpreter, notes)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gym_config(*, port: int, upstream: str, capture_dir: Path) -> dict[str, object]:
    """The global config ``ng_run`` would hand the model server (JSON is valid YAML)."""
    return {
        "head_server": {"host": "127.0.0.1", "port": _free_port()},
        "dry_run": False,
        "observability_enabled": True,
        "model_call_capture_dir": str(capture_dir.resolve()),
        "policy_model": {
            "responses_api_models": {
                "openai_model": {
                    "entrypoint": "app.py",
                    "host": "127.0.0.1",
                    "port": port,
                    "openai_base_url": upstream.rstrip("/") + "/v1",
                    "openai_api_key": "unused",
                    "openai_model": "sim-model-1",
                }
            }
        },
    }


def _healthy(port: int) -> bool:
    try:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        conn.request("GET", "/health")
        ok = conn.getresponse().status == 200
        conn.close()
    except OSError:
        return False
    return ok


@contextmanager
def run_gym_server(env: GymEnv, upstream: str, capture_dir: Path) -> Iterator[ServiceProcess]:
    """Gym's openai_model server with capture into ``capture_dir``, as its own process."""
    server_dir = subprocess.run(
        [
            str(env.python),
            "-c",
            "import responses_api_models.openai_model as m, os;print(os.path.dirname(m.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    port = _free_port()
    config = gym_config(port=port, upstream=upstream, capture_dir=capture_dir)
    child_env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    child_env |= {
        "NEMO_GYM_CONFIG_DICT": json.dumps(config),
        "NEMO_GYM_CONFIG_PATH": "policy_model",
    }
    log_path = Path(tempfile.mkdtemp(prefix="ngcapture-gym-")) / "log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [str(env.python), "app.py"],
            cwd=server_dir,
            env=child_env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    service = ServiceProcess("nemo-gym", process, port, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _healthy(port):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"NeMo Gym's model server did not start:\n{service.log()[-3000:]}"
                )
            time.sleep(0.1)
        yield service
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)  # uvicorn's graceful stop
        service.stop()
