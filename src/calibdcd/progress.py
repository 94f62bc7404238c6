"""How a wait is shown: the one constructor of the inner progress bars (tqdm).

The experiment's outer bar (one line per setting) stays on screen; every bar below it - a
target's generations, VeilProbe's masked LM, perturbations, mapping model and features,
DPDLLM's queries, reference LM and features, a lab's training - is an inner bar: counts, rate
and ETA while it runs, and erased when done (``leave=False``), so the terminal keeps the
finished settings' lines and not hundreds of finished bars. tqdm stacks concurrent bars below
each other by itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["inner_bar"]

T = TypeVar("T")


def inner_bar(
    iterable: Iterable[T] | None = None,
    *,
    desc: str,
    total: int | None = None,
    unit: str = "it",
    enabled: bool = True,
) -> Any:
    """A tqdm bar for one step of a longer job (disabled: a silent pass-through)."""
    return tqdm(
        iterable,
        desc=desc,
        total=total,
        unit=unit,
        disable=not enabled,
        leave=False,
        dynamic_ncols=True,
    )
