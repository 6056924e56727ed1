"""Every notebook in ``notebooks/`` runs to completion in a real Jupyter kernel.

Each notebook is copied (with ``_setup.py``) into a temporary folder and executed there by
nbclient with the venv's ``python3`` kernel; any cell error fails the test. The notebooks read the
demo output of the checkout (``results/demo``, generated when missing) and write only to temporary
folders. Notebooks are stored without outputs: a separate test checks every code cell.
"""

from __future__ import annotations

import hashlib
import shutil
import sys
import time
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat", reason="nbformat is not installed")
nbclient = pytest.importorskip("nbclient", reason="nbclient is not installed")

REPO = Path(__file__).resolve().parents[2]
NOTEBOOK_DIR = REPO / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
CELL_TIMEOUT_S = 120  # the first cell may generate the demo output (about 10 s)
PROBE = "import sys\nprint(sys.prefix)"


def _digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def test_the_three_notebooks_exist() -> None:
    assert [p.name for p in NOTEBOOKS] == [
        "01_explore_run.ipynb",
        "02_compare_checkpoints.ipynb",
        "03_export_to_wandb.ipynb",
    ]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_stored_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert code, "a notebook without code"
    for cell in code:
        assert cell.outputs == [], cell.source[:60]
        assert cell.execution_count is None, cell.source[:60]
    assert "widgets" not in notebook.metadata  # no saved widget state either
    assert notebook.metadata.kernelspec.name == "python3"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_a_real_kernel(
    path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    work = tmp_path / "notebooks"
    work.mkdir()
    shutil.copy2(NOTEBOOK_DIR / "_setup.py", work)
    shutil.copy2(path, work)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    # The kernel inherits this environment: the checkout to read the demo from, and every
    # temporary or W&B file under tmp_path.
    monkeypatch.setenv("NGCAPTURE_REPO", str(REPO))
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.setenv("WANDB_DATA_DIR", str(tmp_path / "wandb-data"))
    monkeypatch.delenv("NGCAPTURE_DEMO_DIR", raising=False)
    before = _digest(NOTEBOOK_DIR)

    notebook = nbformat.read(work / path.name, as_version=4)
    notebook.cells.insert(0, nbformat.v4.new_code_cell(PROBE))
    client = nbclient.NotebookClient(
        notebook,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        allow_errors=False,
        resources={"metadata": {"path": str(work)}},
    )
    started = time.perf_counter()
    client.execute()  # raises CellExecutionError on the first failing cell
    elapsed = time.perf_counter() - started

    probe = notebook.cells[0].outputs
    assert probe and probe[0]["text"].strip() == sys.prefix  # the venv's interpreter
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    assert all(cell.execution_count for cell in code)  # every cell ran
    errors = [o for cell in code for o in cell.outputs if o.get("output_type") == "error"]
    assert errors == []
    assert _digest(NOTEBOOK_DIR) == before  # nothing was written into the repo's notebooks
    assert elapsed < 60, f"{path.name} took {elapsed:.1f} s"
