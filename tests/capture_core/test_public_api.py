from __future__ import annotations

import json
import subprocess
import sys

import capture_core
import capture_core.collect
import capture_core.observations
import capture_core.server
import capture_core.staging
import capture_core.testing
import capture_core.tokens
import ngcapture_viz

HEAVY = ("polars", "plotly", "ipywidgets", "wandb")


def _isort_key(name: str) -> tuple[int, str]:
    """Constants, then classes, then functions (the order ruff's RUF022 keeps)."""
    return (0 if name.isupper() else 1 if name[0].isupper() else 2, name)


def test_public_names_are_sorted_and_exist() -> None:
    modules = (capture_core, capture_core.server, capture_core.staging, capture_core.testing,
               capture_core.tokens, capture_core.collect, capture_core.observations,
               ngcapture_viz)  # fmt: skip
    for module in modules:
        names = list(module.__all__)
        assert names == sorted(names, key=_isort_key), module.__name__
        for name in names:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_import_capture_core_stays_light() -> None:
    code = (
        "import sys, json, capture_core, capture_core.testing; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []
    # The check means something only if the heavy packages are installed: prove they import.
    probe = "import polars, plotly, ipywidgets; print('ok')"
    installed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=False
    )
    assert installed.stdout.strip() == "ok", installed.stderr


def test_public_names_are_imported_lazily_and_all_resolve() -> None:
    """``import capture_core`` loads no implementation module; every name in ``__all__`` is
    named in the lazy table (the TYPE_CHECKING imports) and resolves to a real object."""
    import subprocess
    import sys

    code = ("import sys, capture_core; "
            "print(sorted(m for m in sys.modules if m.startswith('capture_core.')))")  # fmt: skip
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)  # fmt: skip
    assert loaded.stdout.strip() == "[]"
    import capture_core

    assert sorted(capture_core._LAZY) == sorted(capture_core.__all__)
    for name in capture_core.__all__:
        assert getattr(capture_core, name) is not None
