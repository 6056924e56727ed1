"""The proxy benchmark's profile mode: py-spy on the ngcapture proxy while wrk drives it at c=64.

Run: ``python -m benchmarks.proxy --profile [--profile-capture-off] [--seconds S]``.
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import orjson

from benchmarks.proxy_measure import (
    ensure_pyspy,
    ensure_wrk,
    parse_pyspy_raw,
    profile_markdown,
    run_wrk,
    summarise_profile,
    wrk_script,
)
from benchmarks.proxy_plan import CONCURRENCY, OUT, _code_identity
from capture_core.testing import request_body
from capture_core.testing.processes import run_capture_server, run_worker


def _pyspy(pyspy: str, pid: int, seconds: float, output: Path, *, gil: bool) -> None:
    args = [
        pyspy,
        "record",
        "--pid",
        str(pid),
        "--duration",
        str(round(seconds)),
        "--rate",
        "100",
        "--format",
        "raw",
        "--full-filenames",
        "--nonblocking",
        "--subprocesses",
        "--output",
        str(output),
    ]
    subprocess.run([*args, "--gil"] if gil else args, check=True, capture_output=True)


def profile(*, seconds: float = 10.0, capture: bool = True, out: Path = OUT) -> Path:
    """py-spy on the ngcapture proxy while wrk drives it at c=64; writes a top-functions summary.

    Two recordings of ``seconds`` each, one after the other under the same wrk run: every
    non-idle sample (a thread waiting in fsync or flock counts), then only samples holding the
    GIL (where the Python CPU goes). Raw stacks: ``proxy-profile-{all,gil}.txt``.
    """
    wrk, pyspy = ensure_wrk(), ensure_pyspy()
    out.mkdir(parents=True, exist_ok=True)
    raws = {"all": out / "proxy-profile-all.txt", "gil": out / "proxy-profile-gil.txt"}
    summary = out / "proxy-profile.md"
    body = orjson.dumps(request_body("chat"))
    with (
        tempfile.TemporaryDirectory(prefix="ngc-bench-profile-") as tmp,
        run_worker(seed=1, ttft_ms=0, ms_per_token=0) as worker,
        run_capture_server(worker.url, Path(tmp) / "calls" if capture else None) as server,
        ThreadPoolExecutor(1) as pool,
    ):
        script = Path(tmp) / "post.lua"
        script.write_text(wrk_script(body, prefixed=True))
        run_wrk(wrk, server.url, script, seconds=2, connections=CONCURRENCY)  # warm
        load = pool.submit(
            run_wrk, wrk, server.url, script, seconds=2 * seconds + 3, connections=CONCURRENCY
        )
        time.sleep(1.0)
        for name, raw in raws.items():
            _pyspy(pyspy, server.process.pid, seconds, raw, gil=name == "gil")
        result = load.result().result
    title = (
        f"py-spy: ngcapture proxy, capture {'on' if capture else 'off'}, wrk -c64, "
        f"{result.req_s:,.0f} req/s while sampled; code {_code_identity()}"
    )
    parts = [f"# {title}", ""]
    for name, heading in (("all", "All non-idle samples"), ("gil", "Samples holding the GIL")):
        stacks = parse_pyspy_raw(raws[name].read_text())
        parts.append(profile_markdown(summarise_profile(stacks), title=f"{heading}, {seconds:g} s"))
    summary.write_text("\n".join(parts))
    print(summary.read_text())
    return summary
