"""What a reader sees first: the run index's grid picture, a party page's headline chart and its collapsed details,
plots that do not mislead (zeros on log axes, enough tick labels, series told apart by colour, the strongest attack
per family, histograms on axes that fit their spread) and the aggregator's page (a gate only when set, the parties'
unresolvable marks, a worst collaborator only where values differ). Records come from the real audit functions on
synthetic scores; figures are read back from matplotlib's objects, pages from their HTML."""

from __future__ import annotations

import csv
import math
import re
from pathlib import Path

import numpy as np
import pytest
from matplotlib.colors import to_rgba

from audit.membership.population_attack import population_attack
from audit.membership.step import scalar_metrics
from audit.reporting import overview_plots
from audit.reporting.headline import Headline, headline_of, strongest_per_family, worst_of
from audit.reporting.party import ReportWriter
from audit.reporting.plots import histogram_bins, log_axis_wanted
from audit.reporting.readings import exact_auc_of
from audit.reporting.verdicts import LEAK, NO_LEAK, NOT_AUDITED
from audit.round_record import SCHEMA_VERSION, RoundRecord
from audit.aggregator_report.writer import AggregatorReportWriter
from audit.aggregator_report.record import round_record, unresolvable

TOLERANCES = (0.001, 0.01, 0.5)


def _attack(rng, shift, n_members=90, n_population=404):
    """A real population attack on Gaussian scores (lower = member): `shift` apart."""
    return population_attack(rng.normal(-shift, 1, n_members), rng.normal(0, 1, 404), rng.normal(0, 1, n_population),
                             TOLERANCES)


def _record(round_num, rng, *, shifts=None, leak=None, gate=None, party="p"):
    shifts = shifts or {"local": {"loss": 0.5, "logits": 0.3, "gradient_norm": 0.1}, "global": {"loss": 0.2},
                        "update": {"loss_reduction": 0.4}}
    attacks = {m: {s: _attack(rng, shift) for s, shift in per.items()} for m, per in shifts.items()}
    record = {"schema_version": SCHEMA_VERSION, "party": party, "round": round_num, "seed": 0,
              "settings": {"fpr_tolerance": list(TOLERANCES)},
              "attacks": {m: {s: a.to_dict() for s, a in per.items()} for m, per in attacks.items()},
              "metrics": scalar_metrics(attacks), "extra": {}}
    if leak is not None:
        record["leak"] = leak
    if gate is not None:
        record["extra"]["gate"] = gate
    return RoundRecord.from_json(record)


def _leak(detected, estimate=0.66, p=1e-4, epsilon=0.0, attack="local / loss", statistic="exact_auc"):
    return {"detected": detected, "confidence": 0.95, "tests": 20, "significant": [{}] if detected else [],
            "headline": {"attack": attack, "statistic": statistic, "estimate": estimate, "chance": 0.5,
                         "p_adjusted": p, "interval": [estimate - 0.06, estimate + 0.06],
                         "corrected_interval": [estimate - 0.1, estimate + 0.1]},
            "floor": {"members": 90, "nonmembers": 404, "exact_auc": 0.6, "tpr_at_fpr": {}},
            "epsilon": {"value": epsilon, "ceiling": 3.3, "sources": 5, "confidence": 0.95, "delta": 1e-5}}


def _write(root, party, records, log_scale=True) -> ReportWriter:
    """Store the rounds and draw the summaries once (write_round would redraw them every round)."""
    writer = ReportWriter(root, party, log_scale=log_scale)
    for record in records:
        writer.store_round(record)
    writer.rebuild_summary()
    return writer


def _visible_tick_labels(fig, axis="y"):
    fig.canvas.draw()  # the Agg canvas lays the ticks out
    ax = fig.axes[0]
    low, high = sorted(ax.get_ylim() if axis == "y" else ax.get_xlim())
    ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
    values = ax.get_yticks() if axis == "y" else ax.get_xticks()
    return [t.get_text() for t, v in zip(ticks, values) if low <= v <= high and t.get_text()]


# ----------------------------------------------------------------------------------------------- per-round plots

@pytest.mark.slow
def test_a_zero_on_a_log_axis_is_an_open_marker_on_the_floor_with_its_count_never_joined(tmp_path, saved_figures):
    """TPR at FPR 0.01 of 0/90 members in rounds 1 and 3 (the demo's zig-zag): the line breaks there, and an open
    marker sits on the axis floor with "0/90" beside it."""
    rng = np.random.default_rng(1)
    records = [_record(r, rng, shifts={"local": {"loss": 0.6}}) for r in range(4)]
    for r in (1, 3):
        rates = records[r].attack("local", "loss")["uncertainty"]["at_fpr"]["0.01"]
        rates["tpr"].update(rate=0.0, k=0, lower=0.0)
        records[r].attack("local", "loss")["tpr_at_fpr"]["0.01"] = 0.0
    for r in (0, 2):  # two decades apart from the zeros' neighbours: a log axis is wanted
        rates = records[r].attack("local", "loss")["uncertainty"]["at_fpr"]["0.01"]
        records[r].attack("local", "loss")["tpr_at_fpr"]["0.01"] = rates["tpr"]["rate"] = 0.3
    _write(tmp_path, "p", records)
    ax = saved_figures["tpr_at_0.01.png"].axes[0]
    assert ax.get_yscale() == "log"
    (line,) = [ln for ln in ax.get_lines() if ln.get_label() == "local / loss"]
    y = np.asarray(line.get_ydata(), dtype=float)
    assert np.isnan(y[[1, 3]]).all() and np.isfinite(y[[0, 2]]).all()  # not joined through the zeros
    floor = ax.get_ylim()[0]
    hollow = [ln for ln in ax.get_lines() if ln.get_markerfacecolor() in ("white", "w", (1, 1, 1, 1))
              and ln.get_linestyle() in ("None", "none", "")]
    (zeros,) = hollow
    assert np.allclose(zeros.get_ydata(), floor) and len(zeros.get_xdata()) == 2
    assert sorted(t.get_text() for t in ax.texts if "/" in t.get_text() and "members" not in t.get_text()) \
        == ["0/90", "0/90"]
    assert len(_visible_tick_labels(saved_figures["tpr_at_0.01.png"])) >= 3


@pytest.mark.slow
def test_every_per_round_plot_has_at_least_three_tick_labels_and_a_log_axis_only_over_decades(tmp_path, saved_figures):
    """TPR at FPR 0.5 spans 0.4-0.9: one power of ten on a log axis gave one label; it is now linear with several.
    AUC plots are linear too. A log axis is kept only where the values span more than a decade."""
    rng = np.random.default_rng(2)
    _write(tmp_path, "p", [_record(r, rng) for r in range(3)])
    assert not log_axis_wanted(np.array([0.45, 0.9])) and log_axis_wanted(np.array([0.002, 0.3]))
    assert saved_figures["tpr_at_0.5.png"].axes[0].get_yscale() == "linear"
    for name in ("auc.png", "all_auc.png", "tpr_at_0.5.png", "tpr_at_0.01.png", "all_tpr_at_0.01.png"):
        labels = _visible_tick_labels(saved_figures[name])
        assert len(labels) >= 3, (name, labels)


@pytest.mark.slow
def test_series_differ_by_colour_and_the_default_view_keeps_the_strongest_attack_per_family(tmp_path, saved_figures):
    rng = np.random.default_rng(3)
    records = [_record(r, rng) for r in range(3)]
    _write(tmp_path, "p", records, log_scale=False)

    def series(name):
        ax = saved_figures[name].axes[0]
        return [ln for ln in ax.get_lines() if " / " in str(ln.get_label())]

    every, default = series("all_auc.png"), series("auc.png")
    assert len(every) == 5 and len({to_rgba(ln.get_color()) for ln in every}) == 5  # colour, not dash alone
    families = {str(ln.get_label()).split(" / ")[0] for ln in default}
    assert len(default) == len(families) == 3  # local, global, update: one each
    strongest = strongest_per_family(records, exact_auc_of)
    assert {tuple(str(ln.get_label()).split(" / ")) for ln in default} == strongest
    local = [s for m, s in strongest if m == "local"]
    means = {s: np.mean([r.attack("local", s)["exact_auc"] for r in records]) for s in ("loss", "logits",
                                                                                          "gradient_norm")}
    assert local == [max(means, key=means.get)]
    page = (tmp_path / "p" / "index.html").read_text()
    assert 'src="all_auc.png"' in page and 'src="all_tpr_at_0.01.png"' in page  # a click away


def test_histograms_use_a_log_axis_where_values_span_decades():
    """Losses near 0 (exponential, spanning five decades): on linear bins most samples share the first bin; on the
    log bins chosen none holds half of them. Logits (Gaussian, negative too) stay linear."""
    rng = np.random.default_rng(4)
    losses = np.concatenate([rng.exponential(0.01, 300), rng.exponential(1.0, 100)])
    bins, log_x = histogram_bins(losses)
    assert log_x and np.allclose(np.diff(np.log(bins)), np.diff(np.log(bins))[0])
    linear = np.histogram(losses, bins=np.linspace(*np.quantile(losses, [0.005, 0.995]), 31))[0]
    assert linear.max() > 0.6 * losses.size
    assert np.histogram(np.clip(losses, bins[0], bins[-1]), bins=bins)[0].max() < 0.5 * losses.size
    assert not histogram_bins(rng.normal(2, 2, 400))[1]
    assert not histogram_bins(rng.uniform(0.5, 3.0, 400))[1]  # positive, but within a decade


# -------------------------------------------------------------------------------------- headline and verdict grid

@pytest.mark.slow
def test_the_headline_chart_shows_epsilon_against_the_budget_or_the_figure_against_chance(tmp_path, saved_figures):
    rng = np.random.default_rng(5)
    budget = {"verdict": "kept", "action": "withhold", "thresholds": {}, "epsilon_budget": 0.5, "retries": 0}
    withheld = {**budget, "verdict": "withheld"}
    records = [_record(0, rng, leak=_leak(False, epsilon=0.1), gate=budget),
               _record(1, rng, leak=_leak(True, epsilon=0.8, p=1e-6), gate=withheld)]
    overview_plots.plot_headline(records, [headline_of(r) for r in records], tmp_path / "h.png", party="p")
    ax = saved_figures["h.png"].axes[0]
    dots = ax.collections[0]
    assert np.allclose(dots.get_offsets()[:, 1], [0.1, 0.8])
    assert [to_rgba(c) for c in dots.get_facecolors()] == [to_rgba(overview_plots.STATE_COLORS[s])
                                                           for s in (NO_LEAK, LEAK)]
    budget_line = [ln for ln in ax.get_lines() if ln.get_color() == "tab:red"]
    assert budget_line and np.allclose(budget_line[0].get_ydata(), 0.5)
    assert any("ceiling" in t.get_text() and "3.3" in t.get_text() for t in ax.texts)  # above the chart: said
    assert "budget" in ax.get_title()

    # Without a budget: one scale for every round, whether its strongest figure is an AUC or a TPR (a TPR of 0.3 is
    # no drop in leakage from an AUC of 0.6): how sure the test is, -log10 of its adjusted p, the figure written by it.
    plain = [_record(0, rng, leak=_leak(False, estimate=0.55, p=0.5)),
             _record(1, rng, leak=_leak(True, estimate=0.3, p=1e-6, statistic="tpr_at_fpr_0.1")),
             _record(2, rng, leak=_leak(True, estimate=0.62, p=1e-3))]
    overview_plots.plot_headline(plain, [headline_of(r) for r in plain], tmp_path / "f.png", party="p")
    ax = saved_figures["f.png"].axes[0]
    markers = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert [ln.get_ydata()[0] for ln in markers] == pytest.approx([-math.log10(0.5), 6, 3])
    assert [to_rgba(ln.get_color()) for ln in markers] == [to_rgba(overview_plots.STATE_COLORS[s])
                                                           for s in (NO_LEAK, LEAK, LEAK)]
    (line,) = [ln for ln in ax.get_lines() if ln.get_color() == "tab:red"]
    assert np.allclose(line.get_ydata(), -math.log10(0.05))  # the leak verdict's level: 95%
    figures = " ".join(t.get_text() for t in ax.texts)
    assert "TPR@0.1 0.3" in figures and "AUC 0.62" in figures

    # A gate with a threshold beside its budget, no bound above 0 proven: zeros under a budget line would hide the
    # threshold that tripped and the leak; the chart is the evidence one.
    both = {**withheld, "thresholds": {"mia_local_loss_exact_auc": 0.6, "leak_epsilon_lb": 0.5}}
    gated = [_record(r, rng, leak=_leak(True, epsilon=0.0, p=1e-3), gate=both) for r in range(2)]
    heads = [headline_of(r) for r in gated]
    assert not overview_plots.epsilon_chart(heads) and overview_plots.epsilon_chart(
        [headline_of(r) for r in records])
    overview_plots.plot_headline(gated, heads, tmp_path / "g.png", party="p")
    assert "budget" not in saved_figures["g.png"].axes[0].get_title()


def test_the_grid_picture_colours_each_cell_by_its_verdict_marks_gated_updates_and_frames_the_worst(tmp_path,
                                                                                                     saved_figures):
    grid = {"a": {0: Headline(NO_LEAK, "kept", estimate=0.55, statistic="exact_auc"),
                  1: Headline(LEAK, "withheld", estimate=0.7, statistic="exact_auc", p_adjusted=1e-8)},
            "b": {0: Headline(LEAK, "dp_retrained", estimate=0.6, statistic="exact_auc", p_adjusted=1e-3)}}
    assert overview_plots.plot_verdict_grid(grid, tmp_path / "g.png")
    ax = saved_figures["g.png"].axes[0]
    cells = {(int(p.get_x()), int(p.get_y())): p for p in ax.patches if p.get_width() == 1}
    assert cells[(0, 0)].get_facecolor()[:3] == pytest.approx(to_rgba(overview_plots.STATE_COLORS[NO_LEAK])[:3])
    assert cells[(1, 1)].get_facecolor()[:3] == pytest.approx(to_rgba(overview_plots.STATE_COLORS[NOT_AUDITED])[:3])
    strong, weak = cells[(1, 0)].get_facecolor(), cells[(0, 1)].get_facecolor()
    assert strong[1] < weak[1]  # the stronger leak is the deeper red
    bands = {(math.floor(p.get_x()), math.floor(p.get_y())): to_rgba(p.get_facecolor()) for p in ax.patches
             if p.get_fill() and p.get_width() < 1}  # a band at the foot of a gated update's cell
    assert bands == {(1, 0): to_rgba(overview_plots.GATE_COLORS["withheld"]),
                     (0, 1): to_rgba(overview_plots.GATE_COLORS["dp_retrained"])}
    (frame,) = [p for p in ax.patches if not p.get_fill()]
    assert (math.floor(frame.get_x()), math.floor(frame.get_y())) == (1, 0)  # a's round 1
    assert worst_of({(p, r): h for p, cells_ in grid.items() for r, h in cells_.items()}) == ("a", 1)
    texts = " ".join(t.get_text() for t in ax.texts)
    assert "withheld" in texts and "DP-retrained" in texts and "not audited" in texts
    assert not overview_plots.plot_verdict_grid({}, tmp_path / "none.png")


# ----------------------------------------------------------------------------------------------------- the pages

@pytest.mark.slow
def test_a_party_page_opens_with_its_chart_and_verdicts_and_collapses_the_rest(tmp_path):
    rng = np.random.default_rng(6)
    _write(tmp_path, "p", [_record(r, rng, leak=_leak(r >= 2)) for r in range(4)])
    page = (tmp_path / "p" / "index.html").read_text()
    body = page[page.index("<body>"):]
    first_details = body.index("<details")
    shown = body[:first_details]
    assert re.findall(r'<img src="([^"]+)"', shown) == ["headline.png"]  # one picture in the default view
    assert "Verdict per round" in shown and "Leak detected in 2 of 4" in shown
    assert (tmp_path / "p" / "headline.png").is_file()
    # the explanations once per page, not per round; each round collapsed, the latest open
    assert page.count("Exact AUC: members against non-members") == 1
    assert page.count('<details class="round"') == 4 and page.count('<details class="round" id="round_0003" open') == 1
    assert "<table" not in shown[shown.index("</table>") + 1:]  # after the verdict table, only collapsed content
    # the metrics table: a row per metric, its interval beside it, no columns of bounds
    table = page[page.index("Metrics per round"):]
    assert "<td>mia_local_loss_exact_auc</td>" in table and "<td>mia_local_loss_exact_auc_lower</td>" not in table
    assert re.search(r"<td>mia_local_loss_tpr_at_fpr_0.001</td>.*?\*</sup>", table)  # 404 cannot resolve 0.001


@pytest.mark.slow
def test_the_run_index_opens_with_the_grid_picture_naming_the_worst_round_and_what_was_sent(tmp_path):
    rng = np.random.default_rng(7)
    gate = {"verdict": "withheld", "action": "withhold", "thresholds": {"mia_local_loss_exact_auc": 0.6},
            "retries": 0}
    for party, leaks in (("alice", [(False, 1.0), (True, 1e-3)]), ("bob", [(True, 1e-9), (False, 1.0)])):
        _write(tmp_path, party, [_record(r, rng, party=party, leak=_leak(detected, p=p), shifts={"local": {"loss": 1}},
                                         gate=gate if (party, r) == ("bob", 0) else None)
                                 for r, (detected, p) in enumerate(leaks)])
    index = (tmp_path / "index.html").read_text()
    body = index[index.index("<body>"):]
    assert body.index('src="verdicts.png"') < body.index("<table")
    assert (tmp_path / "verdicts.png").is_file()
    assert "Worst: bob, round 0: local / loss AUC 0.66" in index
    assert "<strong>What was sent</strong>" in index
    assert "<strong>bob</strong>: sent nothing (withheld) in round 0; sent as trained (no gate) in round 1." in index
    assert "<strong>alice</strong>: sent as trained (no gate) in rounds 0, 1." in index
    # the ungated parties' grid cells say what was sent, and the trained update is what the cell's verdict is of
    assert "sent as trained (no gate)" in index and "withheld: nothing sent" in index


def test_the_aggregator_page_names_a_gate_only_when_set_and_collapses_its_tables(tmp_path):
    sent = {n: {"gate_kept": 1.0, "gate_retries": 0.0, "gate_epsilon": 0.0, "mia_local_loss_exact_auc": 0.6,
                "mia_local_loss_tpr_at_fpr_0.001": 0.0, "population__mia_local_loss": 404.0} for n in ("a", "b")}
    sent["b"]["mia_local_loss_exact_auc"] = 0.7
    AggregatorReportWriter(tmp_path / "aggregator").write_round(
        round_record(0, authorized=["a", "b"], stragglers=[], metrics=sent))
    page = (tmp_path / "aggregator" / "index.html").read_text()
    assert "No gate is set" in page and "Gate metric" not in page and "Gate:" not in page
    assert "<details open" not in page  # no raw table opens the page
    rows = {m: row for m, row in re.findall(r"<tr><td[^>]*>([a-z0-9_.]+)</td>(.*?)</tr>", page)}
    # equal values: nobody is the worst; differing ones: the larger's party
    assert "all equal" in rows["mia_local_loss_tpr_at_fpr_0.001"] and ">b<" in rows["mia_local_loss_exact_auc"]
    # the population of 404 cannot resolve FPR 0.001: marked as the parties' pages mark it; 0.6's AUC is not
    assert rows["mia_local_loss_tpr_at_fpr_0.001"].count("*</sup>") == 4  # mean, worst, a, b
    assert "*</sup>" not in rows["mia_local_loss_exact_auc"]
    entry = round_record(0, authorized=["a"], stragglers=[], metrics={"a": sent["a"]})["collaborators"]["a"]
    assert entry["population"] == {"mia_local_loss": 404} and "population__mia_local_loss" not in entry["other_metrics"]
    assert unresolvable(entry, "mia_local_loss_tpr_at_fpr_0.001")
    assert not unresolvable(entry, "mia_local_loss_tpr_at_fpr_0.01")
    assert not unresolvable({"population": {}}, "mia_local_loss_tpr_at_fpr_0.001")  # sent none: no mark claimed


def test_the_aggregator_page_of_a_gated_dp_run_names_every_rule_in_words_and_the_utility_cost(tmp_path):
    """Two gate rules (the budget on the epsilon bound and an AUC threshold): both named, with a human label and how
    often each tripped; each collaborator's cell shows what tripped it; the trained update's verdict says whose it
    is; p-values are not averaged; the global model's accuracy per round is a result on the page."""
    def sent(retries, kept, auc, p):
        return {"gate_kept": kept, "gate_retries": retries, "gate_epsilon": 10.8 if retries else 0.0,
                "gate_threshold__leak_epsilon_lb": 0.1, "gate_threshold__mia_local_loss_exact_auc": 0.6,
                "gate_tripped__leak_epsilon_lb": 0.0, "gate_tripped__mia_local_loss_exact_auc": auc + 0.06,
                "mia_local_loss_exact_auc": auc, "leak_detected": 1.0, "leak_p_value": p, "leak_epsilon_lb": 0.0}
    writer = AggregatorReportWriter(tmp_path / "aggregator")
    for r, accuracy in enumerate((0.10, 0.12, 0.13)):
        writer.write_round(round_record(r, authorized=["a", "b"], stragglers=[],
                                        metrics={"a": sent(2, 0.0, 0.61, 1e-4), "b": sent(1, 1.0, 0.62, 0.02)},
                                        aggregator_logs={"aggregator/aggregated_model_validation/accuracy": accuracy}))
    page = (tmp_path / "aggregator" / "index.html").read_text()
    assert ("proven ε lower bound (family-wise) (<code>leak_epsilon_lb</code>) at most 0.1: tripped 0 times; "
            "exact AUC: local / loss (<code>mia_local_loss_exact_auc</code>) at most 0.6: tripped 6 times") in page
    assert "exact AUC: local / loss: 0.61; compared 0.67 &gt; 0.6 (tripped)" in page
    assert "withheld</span> · <span class=\"leak\">trained update: leak detected (p 0.0001)" in page
    assert "<h2>exact AUC: local / loss per round</h2>" in page and "<h2>leak_epsilon_lb per round" not in page
    rows = {m: row for m, row in re.findall(r"<tr><td[^>]*>([a-z0-9_.]+)</td>(.*?)</tr>", page)}
    assert "not averaged" in rows["leak_p_value"] and ">a<" in rows["leak_p_value"]  # the smaller p is the worse
    assert "not averaged" in rows["leak_epsilon_lb"] and "not averaged" not in rows["mia_local_loss_exact_auc"]
    assert "Utility: the global model" in page and "went from 0.1 at round 0 to 0.13 at round 2" in page
    assert "rounds averaged with a DP retrain or an update withheld: +0.015 a round on average (2 rounds)" in page
    from audit import write_index
    index = write_index(tmp_path).read_text()  # the run index says it too, in the same words
    assert "<strong>Utility</strong> (aggregator): The global model&#x27;s validation accuracy" in index
    assert "+0.015 a round on average (2 rounds)" in index
    decisions = (tmp_path / "aggregator" / "decisions.csv").read_text()
    assert ("b,kept,sent a DP retrain (try 1 passed); the trained update tripped: mia_local_loss_exact_auc: its gate "
            "compared 0.68 (a bound of the estimate 0.62)") in decisions
    metrics = list(csv.DictReader((tmp_path / "aggregator" / "metrics.csv").open()))
    assert metrics[0]["leak_p_value"] == "" and float(metrics[0]["worst:leak_p_value"]) == 1e-4


def test_the_aggregator_page_of_an_ungated_run_plots_how_sure_not_zeros_and_says_no_gate(tmp_path):
    """Without a gate the page plots each party's leak test p-value (the worst is the smallest, on a log axis), not a
    chart of zero epsilon bounds; each cell and decisions.csv say "no gate"; a leak with a zero bound says why."""
    sent = {"a": {"gate_kept": 1.0, "leak_detected": 1.0, "leak_p_value": 1e-4, "leak_epsilon_lb": 0.0},
            "b": {"gate_kept": 1.0, "leak_detected": 0.0, "leak_p_value": 0.4, "leak_epsilon_lb": 0.0}}
    AggregatorReportWriter(tmp_path / "aggregator").write_round(
        round_record(0, authorized=["a", "b"], stragglers=[], metrics=sent))
    page = (tmp_path / "aggregator" / "index.html").read_text()
    assert "gate_leak_p_value.png" in page and "gate_leak_epsilon_lb.png" not in page
    assert "<h2>leak test&#x27;s adjusted p-value per round</h2>" in page and "the worst (smallest)" in page
    assert page.count('<span class="muted">no gate</span>') == 2
    assert "trained update: leak detected (p 0.0001); ε ≥ 0 (beats chance, no ε provable with its counts)" in page
    assert "withheld or DP-retrained" not in page.split("<h2>")[0]  # nothing was gated: no such words up top
    assert (tmp_path / "aggregator" / "decisions.csv").read_text().count("no gate: averaged as trained") == 2


def test_the_consoles_attack_table_names_each_population_and_says_its_epsilon_is_uncorrected(tmp_path, capsys):
    """The demo's per-attack table: a footnote naming each attack's own population where they differ (RMIA's
    independent references train on part of it), and its "eps >=" column said to be each attack's alone."""
    from workspace.demo_output import print_attack_summary

    rng = np.random.default_rng(9)
    record = _record(0, rng, shifts={"local": {"loss": 0.5}})
    data = record.to_json()
    data["attacks"]["rmia"] = {"independent": _attack(rng, 0.5, n_population=314).to_dict()}
    writer = ReportWriter(tmp_path, "p")
    writer.store_round(RoundRecord.from_json(data))
    print_attack_summary(tmp_path, ["p"])
    out = capsys.readouterr().out
    assert "* FPR 0.001: 404 population samples (314 for rmia / independent) cannot resolve it" in out
    assert "eps >= (alone)" in out and "the verdict's ε below is corrected for all of them" in out
