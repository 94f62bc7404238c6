"""How a wait is shown: the one constructor of the inner progress bars (tqdm).

The experiment's outer bar (one line per setting) stays on screen; every bar below it - a
target's generations, VeilProbe's masked LM, perturbations, mapping model and features,
DPDLLM's queries, reference LM and features, a lab's training - is an inner bar: counts, rate
and ETA while it runs, and erased when done (``leave=False``), so the terminal keeps the
finished settings' lines and not hundreds of finished bars. tqdm stacks concurrent bars below
each other by itself.

A job of several steps (``calibdcd fit``, ``calibdcd score``) shows one :func:`status_line`
above its inner bars: a sentence naming the job and its current step, with the time so far
("scoring 3,000 texts: step 1 of 2: features of the 3,000 texts to score [00:41 so far]");
the step's own waits (the target's requests, a model's training) are inner bars below it, with
their count, rate (requests/s) and ETA.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from tqdm.auto import tqdm

__all__ = ["StatusLine", "inner_bar", "status_line"]

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


class StatusLine:
    """One line naming a job and the step it is in (see the module doc); call it with each
    step's sentence. Erased when closed, as the inner bars are. Used as a context manager, a
    warning shown while it is open clears the bars, prints on a line of its own and lets them
    come back (rather than being appended to the status line)."""

    def __init__(self, job: str, *, enabled: bool = True) -> None:
        self.job = job
        self.enabled = enabled
        self._shown: Any = None
        self.bar = tqdm(
            total=None,
            desc=job,
            bar_format="{desc} [{elapsed} so far]",
            disable=not enabled,
            leave=False,
            dynamic_ncols=True,
        )

    def __call__(self, message: str) -> None:
        self.bar.set_description_str(f"{self.job}: {message}")

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> StatusLine:
        if self.enabled:
            import sys
            import warnings

            shown = self._shown = warnings.showwarning

            def show(*args: Any, **kwargs: Any) -> None:
                with tqdm.external_write_mode(file=sys.stderr):
                    shown(*args, **kwargs)

            warnings.showwarning = show
        return self

    def __exit__(self, *exc: object) -> None:
        if self._shown is not None:
            import warnings

            warnings.showwarning = self._shown
            self._shown = None
        self.close()


def status_line(job: str, *, enabled: bool = True) -> StatusLine:
    """The status line of a job of several steps (disabled: silent)."""
    return StatusLine(job, enabled=enabled)
