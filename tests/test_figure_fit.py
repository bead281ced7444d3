"""The report's figures saved at their own size only where nothing is cut (audit.reporting.figure_fit).

A figure saved without a tight box keeps what is drawn outside its canvas out of the image. So every figure saved at
its size is drawn again here and its whole drawn extent (matplotlib's tight box, the reference) must lie on the canvas:
the per-round plots with the widest tick labels their axes can have, linear and log, and the ROC figure, linear and
log-log. A plug-in's long signal name or a long party name must grow the image instead, to hold them.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from PIL import Image

from audit.reporting import figure_fit, plots
from audit.round_record import RoundRecord
from test_report import make_attack, make_record

DPI = plots.DPI


@pytest.fixture
def saves(monkeypatch):
    """Each figure saved through figure_fit: (figure, its file, whether saved tight)."""
    kept = []
    save = figure_fit.atomic_savefig

    def keep(fig, path, **kwargs):
        kept.append((fig, Path(path), kwargs.get("bbox_inches") == "tight"))
        return save(fig, path, **kwargs)

    monkeypatch.setattr(figure_fit, "atomic_savefig", keep)
    return kept


def drawn_extent(fig):
    """Everything the figure draws, in pixels, as matplotlib's tight box measures it after a real draw."""
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return fig.get_tightbbox(canvas.get_renderer()).transformed(fig.dpi_scale_trans)


def assert_nothing_cut(fig, path: Path):
    box, size = drawn_extent(fig), fig.bbox
    assert box.x0 >= -0.5 and box.y0 >= -0.5 and box.x1 <= size.x1 + 0.5 and box.y1 <= size.y1 + 0.5, (path.name, box)
    width, height = Image.open(path).size
    assert (width, height) == (round(size.width), round(size.height)), path.name


def records_with(values_per_round: list[float], party: str = "p", signal: str = "loss") -> list[RoundRecord]:
    """One local attack per round; each round's TPR at FPR 0.1 and exact AUC are the given value."""
    rng = np.random.default_rng(0)
    out = []
    for r, value in enumerate(values_per_round):
        rec = make_record(r, party=party, models=())
        attack = make_attack(rng, signal, 0.5)
        attack["tpr_at_fpr"] = {k: value for k in attack["tpr_at_fpr"]}
        attack["exact_auc"] = value
        rec["attacks"] = {"local": {signal: attack}}
        rec["settings"]["signals"] = [signal]
        out.append(RoundRecord.from_json(rec, "record"))
    return out


@pytest.mark.parametrize("values", [
    [0.5, 0.9], [0.02, 0.98],  # linear AUC axes
])
def test_an_auc_plot_that_fits_is_saved_at_its_size_and_nothing_is_cut(tmp_path, saves, values):
    path = tmp_path / "auc.png"
    plots.plot_per_round(records_with(values), path, party="collaborator1", value_of=lambda res: res["exact_auc"],
                         ylabel="exact AUC (every threshold)", chance=0.5, chance_label="chance (AUC 0.5)",
                         title="exact AUC per round, every attack", flag_below=0.5,
                         band_of=lambda res: (res["exact_auc"] - 0.05, res["exact_auc"] + 0.05))
    fig, saved, tight = saves[-1]
    assert not tight
    assert_nothing_cut(fig, saved)


# The widest tick labels of a per-round TPR axis: its floor is half the smallest positive value (>= 1e-6), its top
# 1.05; over 1.2-4 decades ticks at 1, 2, 5 x 10^k ("0.0005"), beyond at powers of ten ("1e-06", "0.0001").
@pytest.mark.parametrize("values", [[3e-4, 0.5], [2.1e-3, 0.9], [3e-6, 0.2], [0.0, 0.3], [0.11, 0.6]])
def test_a_tpr_plot_on_its_widest_tick_labels_is_saved_at_its_size_and_nothing_is_cut(tmp_path, saves, values):
    path = tmp_path / "tpr.png"
    plots.plot_per_round(records_with(values), path, party="collaborator1",
                         value_of=lambda res: next(iter(res["tpr_at_fpr"].values())), ylabel="TPR at FPR ≤ 1e-05",
                         chance=1e-5, chance_label="chance (TPR = 1e-05)", title="TPR at FPR ≤ 1e-05 per round",
                         log_y=True, counts_of=lambda res: (0, 120))
    fig, saved, tight = saves[-1]
    assert not tight
    assert_nothing_cut(fig, saved)


@pytest.mark.parametrize("log_scale", [True, False])
def test_a_roc_figure_of_three_models_is_saved_at_its_size_and_nothing_is_cut(tmp_path, saves, log_scale):
    record = RoundRecord.from_json(make_record(3), "record")
    plots.plot_roc(record, tmp_path / "roc.png", log_scale)
    fig, saved, tight = saves[-1]
    assert not tight
    assert_nothing_cut(fig, saved)


def test_a_long_signal_name_or_party_name_grows_the_image_instead_of_being_cut(tmp_path, saves):
    long_signal = "a_plugin_signal_with_a_name_as_long_as_its_author_wanted"
    plots.plot_per_round(records_with([0.6, 0.7], signal=long_signal), tmp_path / "auc.png", party="p",
                         value_of=lambda res: res["exact_auc"], ylabel="exact AUC", chance=0.5,
                         chance_label="chance (AUC 0.5)", title="exact AUC per round")
    party = "p" * 128  # the longest name a party may have
    plots.plot_per_round(records_with([0.6, 0.7]), tmp_path / "party.png", party=party,
                         value_of=lambda res: res["exact_auc"], ylabel="exact AUC", chance=0.5,
                         chance_label="chance (AUC 0.5)", title="exact AUC per round")
    for fig, saved, tight in saves:
        assert tight, saved.name
        box = drawn_extent(fig)
        width, _ = Image.open(saved).size
        assert width > fig.bbox.width  # grown beyond the canvas
        assert width >= box.width  # and holds all that is drawn
    texts = [t.get_text() for t in saves[0][0].axes[0].get_legend().get_texts()]
    assert f"local / {long_signal}" in texts


def test_only_what_leaves_the_canvas_is_named_and_the_figure_keeps_its_dpi(tmp_path):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4, 3), dpi=DPI)
    ax = fig.add_subplot()
    inside = ax.text(0.5, 0.5, "in", transform=ax.transAxes)
    right = ax.text(1.02, 0.5, "x" * 60, transform=ax.transAxes)
    hidden = ax.text(1.02, 0.2, "x" * 60, transform=ax.transAxes, visible=False)
    assert figure_fit.outside_of_figure(fig, [inside, None, right, hidden]) == [right]
    fig.set_dpi(2 * DPI)  # saved at the dpi its extents were measured at: the figure's own
    assert Image.open(figure_fit.save_fitted(fig, tmp_path / "f.png", sized_by_data=[inside])).size == (800, 600)
