"""Measured curves: RLHF jobs driven by the real-run corpus (``curves.source: measured:PATH``).

``PATH`` is a folder of the real-run corpus (the repository's is ``configs/corpus``; its format and its
preregistered label rule: :mod:`evalstop_trl.analysis.corpus`). Each run there is a real, tiny RLHF run
trained to its end: its world feedback (what a platform sees), its train loss and proxy reward, and
apart, a trusted *gold* eval used only for its label.

With measured curves every RLHF job of the workload draws one corpus run with the simulator's seeded
curves stream (salted like the fitted curves): the job's status (hacked or healthy) is drawn as for
fitted curves (``curves.hack_fraction``), and the run comes from the corpus runs of that *gold* label,
uniformly. The label is the corpus's rule on the run's gold alone (:func:`evalstop_trl.analysis.corpus.label`),
never the world feedback. The run's series are resampled to the job's own evals by training progress
(step / max_steps; linear between the run's evals, the first and last values held outside them):

* the observed score is the run's **world feedback** as measured: its eval noise is already in it,
  so ``noise.*`` adds nothing (and per-example evals are refused);
* the loss and proxy reward are the run's own (a missing value is interpolated from its neighbours;
  a run without any is skipped and counted);
* the ground truth is the run's **gold**: the hidden curve (:attr:`JobTruth.curve_gold`), its first
  peak, its last value and the run's own **harm margin** (the preregistered one, in the run's units),
  which replaces ``metrics.harmful_margin`` for these jobs. No constant in score units decides
  anything for a measured job; LoRA and DPO jobs keep their fitted curves (in Gao's units).

The corpus is read once per process and folder (:func:`load_measured`): a run written there
later joins only in a new process, so every seed and policy of one experiment sees the same runs
(``platform-sim`` reads it before its worker processes fork).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .config import MEASURED, ConfigError

__all__ = ["MeasuredCorpus", "MeasuredRun", "load_measured"]

#: how to name the corpus in an error's fix
_FIX = ("give the real-run corpus's folder, the one holding runs/*.jsonl and preregistration.yaml: "
        "e.g. --set curves.source=measured:configs/corpus from the repository root (a relative path in a "
        "config file is relative to that file)")


@dataclass(frozen=True, eq=False)
class MeasuredRun:
    """One corpus run, as the simulator uses it (series at the run's own evals)."""

    name: str
    hacked: bool  # the corpus's label, from its gold alone
    harm_margin: float  # the run's preregistered harm margin, in its gold units
    progress: np.ndarray  # step / max_steps of each eval
    world_feedback: np.ndarray
    gold: np.ndarray
    loss: np.ndarray
    proxy: np.ndarray

    @property
    def peak_progress(self) -> float:
        """Progress of the gold's first maximum (the corpus's :func:`~evalstop_trl.analysis.corpus.gold_peak`)."""
        return float(self.progress[int(np.argmax(self.gold))])

    def at(self, series: np.ndarray, p: np.ndarray) -> np.ndarray:
        """``series`` (one of this run's) at progress ``p``, linear between the run's evals."""
        return np.interp(p, self.progress, series)


@dataclass(frozen=True, eq=False)
class MeasuredCorpus:
    """The usable runs of one corpus folder, by gold label, in name order; ``skipped``: runs left out, by reason."""

    folder: str
    hacked: tuple[MeasuredRun, ...]
    healthy: tuple[MeasuredRun, ...]
    skipped: tuple[tuple[str, int], ...]

    def summary(self) -> str:
        """One line for ``platform-sim run`` and ``describe``: the runs by label and those skipped."""
        skipped = ", ".join(f"{v} {k}" for k, v in self.skipped) or "none"
        return (f"measured curves: {len(self.hacked)} hacked and {len(self.healthy)} healthy runs (labels from their "
                f"gold) at {self.folder}; skipped: {skipped}")

    def pick(self, hacked: bool, u: float, hack_fraction: float) -> MeasuredRun:
        """The run of uniform draw ``u`` in [0, 1) among the runs labelled ``hacked``.

        Raises:
            ConfigError: the corpus holds no run of that label.
        """
        pool = self.hacked if hacked else self.healthy
        if not pool:
            other = len(self.healthy if hacked else self.hacked)
            want, fix = (("hacked", "lower curves.hack_fraction to 0 or add hacked runs") if hacked
                         else ("healthy", "raise curves.hack_fraction to 1 or add healthy runs"))
            raise ConfigError(
                f"curves.source: {MEASURED}{self.folder}: the corpus holds no {want} run by its gold (its {other} "
                f"usable runs are all {'healthy' if hacked else 'hacked'}), but curves.hack_fraction={hack_fraction:g} "
                f"gives this workload {want} RLHF jobs; {fix}")
        return pool[min(int(u * len(pool)), len(pool) - 1)]


def _filled(values: tuple[float | None, ...], progress: np.ndarray) -> np.ndarray | None:
    """The series with each missing value interpolated from its neighbours (None: no value at all)."""
    have = np.array([v is not None for v in values])
    if not have.any():
        return None
    known = np.array([v for v in values if v is not None], dtype=float)
    return np.interp(progress, progress[have], known)


def load_measured(folder: str | Path) -> MeasuredCorpus:
    """The corpus at ``folder`` (relative: to the working directory), read once per process.

    Raises:
        ConfigError: the folder, its runs or its preregistration is missing or unreadable, or no run is usable.
    """
    resolved = str(Path(folder).expanduser().resolve())
    if resolved not in _READ:
        _READ[resolved] = _load(resolved, str(folder))
    return _READ[resolved]


_READ: dict[str, MeasuredCorpus] = {}  # resolved folder -> its corpus as first read in this process


def _load(resolved: str, given: str) -> MeasuredCorpus:
    from evalstop_trl.analysis.corpus import harm_margin, label, load_preregistration, read_corpus, rule_of

    path = Path(resolved)
    where = f"curves.source: {MEASURED}{given}"
    if not path.is_dir():
        raise ConfigError(f"{where}: the folder {path} does not exist; {_FIX}")
    if not any((path / "runs").glob("*.jsonl")):
        raise ConfigError(f"{where}: {path / 'runs'} holds no run (*.jsonl); {_FIX}")
    prereg = path / "preregistration.yaml"
    if not prereg.is_file():
        raise ConfigError(f"{where}: {prereg} does not exist: the label rule comes from it; {_FIX}")
    try:
        rule = rule_of(load_preregistration(prereg))
        records = read_corpus(path)
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: {exc!r} reading the corpus at {path}; {_FIX}") from None
    hacked, healthy, skipped = [], [], {}
    for rec in records:
        progress = np.asarray(rec.steps, dtype=float) / rec.config.max_steps
        loss, proxy = _filled(rec.train_loss, progress), _filled(rec.proxy_reward, progress)
        if loss is None or proxy is None:
            reason = "no train loss" if loss is None else "no proxy reward"
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        run = MeasuredRun(rec.name, label(rec, rule), harm_margin(rec, rule), progress,
                          np.asarray(rec.world_feedback, dtype=float), np.asarray(rec.gold, dtype=float), loss, proxy)
        (hacked if run.hacked else healthy).append(run)
    if not hacked and not healthy:
        raise ConfigError(f"{where}: none of the {len(records)} runs at {path} is usable "
                          f"({', '.join(f'{v} {k}' for k, v in skipped.items())}); {_FIX}")
    return MeasuredCorpus(given, tuple(hacked), tuple(healthy), tuple(sorted(skipped.items())))
