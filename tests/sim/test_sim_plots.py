"""detectors.png (``platform_sim.plots.plot_detectors``): no legend covers a plotted point's axes."""

from __future__ import annotations

import pytest

from platform_sim import plots
from platform_sim.metrics import Detection
from platform_sim.results import DetectorRow
from platform_sim.stats import Rates


def _row(name: str, sigma: float, evals: int, precision_tp: int, retention: float) -> DetectorRow:
    d = Detection(tp=precision_tp, fp_a=30, fp_b=100 - precision_tp, hacked=100, healthy=100, flagged=130)
    return DetectorRow(name, {}, sigma, evals, Rates(d, (0.0, 1.0), (0.0, 1.0), (0.0, 1.0)), retention, (0.0, 1.0),
                       -0.1, (-0.2, 0.0))


def test_the_legends_sit_outside_both_panels(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots.plt, "close", figures.append)  # keep the figure to measure it
    rows = [_row(n, s, e, tp, r) for n, tp, r in (("decline", 99, 0.64), ("trend", 98, 0.55), ("cusum", 95, 0.5))
            for s, e in ((0.04, 10), (0.12, 10), (0.04, 20))]
    out = plots.plot_detectors(rows, tmp_path / "detectors.png")
    assert out.exists() and out.stat().st_size > 10_000
    (fig,) = figures
    renderer = fig.canvas.get_renderer()
    legends = fig.legends + [a.get_legend() for a in fig.axes if a.get_legend() is not None]
    assert legends, "no legend drawn"
    for legend in legends:
        box = legend.get_window_extent(renderer)
        for ax in fig.axes:
            assert not box.overlaps(ax.get_window_extent(renderer)), "a legend covers a panel"
    assert [a.get_title() for a in fig.axes[:2]] == ["all settings", "precision >= 0.9"]
    assert fig.axes[1].get_ylim()[0] == pytest.approx(0.9)
