"""pandas at the edge: frames in (converted once, to Polars) and out (``CaptureRun.to_pandas``).

Every public function that takes a frame accepts a pandas DataFrame as well: the decorator
:func:`accepts_pandas` converts it with ``polars.from_pandas`` before the function runs and
casts the columns a frame schema declares (``CALLS``, ``ROLLOUTS``...) back to their dtypes,
so numpy-backed integers with NaN come back as nullable integers and the result is the one a
Polars frame gives. Out, :func:`to_pandas` uses pyarrow-backed columns: dtypes and nulls round
trip exactly. pandas and pyarrow are the ``pandas`` extra (``pip install 'ngcapture[pandas]'``).

Example:
    >>> import ngcapture_viz as ngv  # doctest: +SKIP
    >>> frames = run.to_pandas()  # doctest: +SKIP
    >>> ngv.latency_percentiles(frames["calls"], by=["model"])  # a pandas input  # doctest: +SKIP
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable
from typing import Any, Final, ParamSpec, TypeVar

import polars as pl

from ngcapture_viz.exceptions import MissingExtraError
from ngcapture_viz.frames._columns import FrameSchema

__all__ = ["PANDAS_HINT", "accepts_pandas", "is_pandas", "require_pandas", "to_pandas", "to_polars"]

PANDAS_HINT: Final = "pip install 'ngcapture[pandas]'"

P = ParamSpec("P")
R = TypeVar("R")


def is_pandas(value: object) -> bool:
    """Whether ``value`` is a pandas DataFrame (checked without importing pandas)."""
    pandas = sys.modules.get("pandas")
    return pandas is not None and isinstance(value, pandas.DataFrame)


def require_pandas() -> None:
    """Raise :class:`MissingExtraError` naming the extra when pandas or pyarrow is missing."""
    missing = [name for name in ("pandas", "pyarrow") if importlib.util.find_spec(name) is None]
    if missing:
        raise MissingExtraError(f"pandas frames need {' and '.join(missing)}: {PANDAS_HINT}")


def to_polars(frame: Any, schema: FrameSchema | pl.Schema | None = None) -> pl.DataFrame:
    """``frame`` as a Polars DataFrame (a pandas one converted; declared columns re-typed)."""
    if isinstance(frame, pl.DataFrame):
        return frame
    if not is_pandas(frame):
        raise TypeError(f"expected a Polars or pandas DataFrame, got {type(frame).__name__}")
    require_pandas()
    converted = pl.from_pandas(frame)
    if schema is None:
        return converted
    dtypes = schema.polars if isinstance(schema, FrameSchema) else schema
    declared = {n: d for n, d in dtypes.items() if n in converted.columns}
    return converted.cast(declared, strict=False)  # type: ignore[arg-type]


def to_pandas(frame: pl.DataFrame) -> Any:
    """``frame`` as a pandas DataFrame with pyarrow-backed columns (nulls stay nulls)."""
    require_pandas()
    return frame.to_pandas(use_pyarrow_extension_array=True)


def accepts_pandas(
    **schemas: FrameSchema | pl.Schema | None,
) -> Callable[[Callable[P, R]], Callable[P, R]]:
    """Convert the named frame arguments from pandas once, at the call (see the module doc).

    Example:
        >>> @accepts_pandas(calls=None)
        ... def count(calls: pl.DataFrame) -> int:
        ...     return calls.height
    """

    def decorate(function: Callable[P, R]) -> Callable[P, R]:
        signature = inspect.signature(function)

        @functools.wraps(function)
        def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
            bound = signature.bind(*args, **kwargs)
            for name, schema in schemas.items():
                value = bound.arguments.get(name)
                if value is not None and is_pandas(value):
                    bound.arguments[name] = to_polars(value, schema)
            return function(*bound.args, **bound.kwargs)

        return wrapper

    return decorate
