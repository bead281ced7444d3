"""Tests for audit.reporting.party (per-party audit reports) and audit.reporting.atomic_io (crash-safe writes)."""

from __future__ import annotations

import copy
import csv
import json
import logging
import math
import os
import shutil
from pathlib import Path

import matplotlib

matplotlib.use("Agg")

import matplotlib.image as mpimg  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from sklearn.metrics import roc_auc_score, roc_curve  # noqa: E402

from audit.reporting import atomic_io  # noqa: E402
from audit.membership.population_attack import population_attack  # noqa: E402
from audit.membership.uncertainty import auc_interval  # noqa: E402
from audit.reporting.party import ReportWriter, load_round_records, write_index  # noqa: E402
from audit.round_record import validate_record  # noqa: E402
from audit.round_record import SCHEMA_VERSION  # noqa: E402

PARTY = "collaborator1"
SIGNALS = ("loss", "logits", "gradient_norm")
TOLERANCES = (0.01, 0.1, 0.5)


# ----------------------------------------------------------------------------------------------
# realistic records: ROC arrays from sklearn on synthetic member / non-member scores


def _json_float(v):
    v = float(v)
    return v if math.isfinite(v) else None  # what AttackResult.to_dict() does (thresholds[0] is inf)


def make_attack(rng, signal, shift, n=120, attack="population"):
    members = rng.normal(shift, 1.0, n)
    nonmembers = rng.normal(0.0, 1.0, n)
    labels = np.r_[np.ones(n), np.zeros(n)]
    fpr, tpr, thresholds = roc_curve(labels, np.r_[members, nonmembers])
    tpr_at, fpr_at, thr_at = {}, {}, {}
    for tol in TOLERANCES:
        i = int(np.flatnonzero(fpr <= tol)[-1])
        tpr_at[f"{tol:g}"], fpr_at[f"{tol:g}"] = float(tpr[i]), float(fpr[i])
        thr_at[f"{tol:g}"] = _json_float(thresholds[i])
    return {
        "attack": attack,
        "signal": signal,
        "auc": float(np.trapezoid(tpr, fpr)),
        "exact_auc": float(roc_auc_score(labels, np.r_[members, nonmembers])),
        "fpr": [float(v) for v in fpr],
        "tpr": [float(v) for v in tpr],
        "thresholds": [_json_float(v) for v in thresholds],
        "tolerances": list(TOLERANCES),
        "tpr_at_fpr": tpr_at,
        "fpr_at_fpr": fpr_at,
        "threshold_at_fpr": thr_at,
        "n_members": n,
        "n_nonmembers": n,
        "n_population": n // 2,
    }


def make_record(round_, party=PARTY, *, models=("local", "global", "update"), seed=0):
    rng = np.random.default_rng(1000 * seed + round_)
    attacks = {}
    if "local" in models:
        attacks["local"] = {s: make_attack(rng, s, 0.2 + 0.15 * round_ + 0.1 * i) for i, s in enumerate(SIGNALS)}
    if "global" in models:
        attacks["global"] = {s: make_attack(rng, s, 0.05 * round_ * (i + 1)) for i, s in enumerate(SIGNALS)}
    if "update" in models:
        attacks["update"] = {"loss_reduction": make_attack(rng, "loss_reduction", 0.3 + 0.1 * round_, attack="update")}
    metrics = {}
    for model, per_signal in attacks.items():
        for signal, a in per_signal.items():
            metrics[f"mia_{model}_{signal}_auc"] = a["auc"]
            metrics[f"mia_{model}_{signal}_exact_auc"] = a["exact_auc"]
            for tol, tpr in a["tpr_at_fpr"].items():
                metrics[f"mia_{model}_{signal}_tpr_at_fpr_{tol}"] = tpr
    metrics["train_loss"] = 1.0 / (round_ + 1)
    metrics["local_accuracy"] = 0.5 + 0.1 * round_
    return {
        "schema_version": SCHEMA_VERSION,
        "party": party,
        "round": round_,
        "seed": seed,
        "settings": {"signals": list(SIGNALS), "fpr_tolerance": list(TOLERANCES), "log_scale": False},
        "timings": {"train_s": 0.8, "audit_s": 0.3, "signals_s": {"local": {s: 0.01 for s in SIGNALS}}},
        "attacks": attacks,
        "metrics": metrics,
        "sizes": {},
        "extra": {"note": "synthetic"},
    }


def snapshot(directory: Path) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def temp_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.name.endswith(atomic_io.TEMP_SUFFIX)]


def read_csv(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def assert_png(path: Path) -> None:
    img = mpimg.imread(path)
    assert img.ndim == 3 and img.shape[2] in (3, 4)
    assert img.shape[0] >= 200 and img.shape[1] >= 300


@pytest.fixture(scope="module")
def written_template(tmp_path_factory):
    """A report with rounds 0, 1, 2 for PARTY, rendered once per module (rendering is the slow part: the tests that
    read it are marked slow)."""
    root = tmp_path_factory.mktemp("report")
    writer = ReportWriter(root, PARTY)
    records = [make_record(r) for r in range(3)]
    for rec in records:
        writer.write_round(rec)
    return root, records


@pytest.fixture
def written(written_template, tmp_path):
    """A private copy of the 3-round report in tmp_path, and a writer on it."""
    root, records = written_template
    shutil.copytree(root, tmp_path, dirs_exist_ok=True)
    return ReportWriter(tmp_path, PARTY), copy.deepcopy(records)


# ----------------------------------------------------------------------------------------------
# the report


@pytest.mark.slow
def test_three_rounds_write_every_file(written, tmp_path):
    writer, records = written
    party_dir = tmp_path / PARTY
    assert writer.party_dir == party_dir
    for name in ["metrics.csv", "auc.png", "tpr_at_0.01.png", "tpr_at_0.1.png", "tpr_at_0.5.png", "index.html"]:
        assert (party_dir / name).is_file(), name
    assert (tmp_path / "index.html").is_file()
    for rec in records:
        rdir = party_dir / f"round_{rec['round']:04d}"
        assert (rdir / "audit.json").is_file() and (rdir / "roc.png").is_file()
        assert json.loads((rdir / "audit.json").read_text()) == rec
    for png in party_dir.rglob("*.png"):
        assert_png(png)
    assert temp_files(tmp_path) == []
    assert plt.get_fignums() == []  # nothing registered with pyplot


@pytest.mark.slow
def test_write_round_returns_round_dir(tmp_path):
    rdir = ReportWriter(tmp_path, PARTY).write_round(make_record(7))
    assert rdir == tmp_path / PARTY / "round_0007"
    assert rdir.is_dir()


@pytest.mark.slow
def test_metrics_csv_rows_and_values(written, tmp_path):
    _, records = written
    rows = read_csv(tmp_path / PARTY / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2]
    header = list(rows[0].keys())
    assert header[0] == "round"
    assert header[1:] == sorted(records[0]["metrics"])
    for row, rec in zip(rows, records):
        for name, value in rec["metrics"].items():
            assert float(row[name]) == value  # exact round-trip (repr of floats)


@pytest.mark.slow
def test_metrics_csv_union_of_keys_with_empty_cells(tmp_path):
    writer = ReportWriter(tmp_path, PARTY)
    a, b = make_record(0), make_record(1, models=("local",))
    b["metrics"]["dp_epsilon"] = 3.5
    writer.write_round(a)
    writer.write_round(b)
    rows = read_csv(tmp_path / PARTY / "metrics.csv")
    assert "dp_epsilon" in rows[0] and rows[0]["dp_epsilon"] == ""
    assert float(rows[1]["dp_epsilon"]) == 3.5
    assert rows[0]["mia_update_loss_reduction_auc"] != "" and rows[1]["mia_update_loss_reduction_auc"] == ""


@pytest.mark.slow
def test_index_html_references_plots_and_rounds_newest_first(written, tmp_path):
    _, records = written
    page = (tmp_path / PARTY / "index.html").read_text()
    for name in ["auc.png", "tpr_at_0.01.png", "tpr_at_0.1.png", "tpr_at_0.5.png", "metrics.csv"]:
        assert f'"{name}"' in page, name
    positions = [page.index(f'src="round_{r:04d}/roc.png"') for r in (2, 1, 0)]
    assert positions == sorted(positions)  # newest first
    assert "round_0000/audit.json" in page
    assert "http://" not in page and "https://" not in page and 'src="/' not in page  # relative only
    # metrics table: one row per round, values shown
    assert f"{records[2]['metrics']['local_accuracy']:.4g}" in page
    root_page = (tmp_path / "index.html").read_text()
    assert f'href="{PARTY}/index.html"' in root_page


@pytest.mark.slow
def test_write_index_lists_every_party(tmp_path):
    ReportWriter(tmp_path, "alice").write_round(make_record(0, party="alice"))
    ReportWriter(tmp_path, "bob").write_round(make_record(0, party="bob"))
    (tmp_path / "not_a_party").mkdir()
    page = write_index(tmp_path).read_text()
    assert 'href="alice/index.html"' in page and 'href="bob/index.html"' in page
    assert "not_a_party" not in page


@pytest.mark.slow
def test_html_escapes_text(tmp_path):
    rec = make_record(0, models=("local",))
    rec["attacks"]["local"]["<script>x</script>"] = rec["attacks"]["local"]["loss"]
    rec["metrics"]['a"<b>'] = 1.0
    rec["extra"] = {"verdict": "<b>blocked</b> & logged"}
    ReportWriter(tmp_path, PARTY).write_round(rec)
    page = (tmp_path / PARTY / "index.html").read_text()
    assert "<script>" not in page and "<b>" not in page
    assert "&lt;script&gt;x&lt;/script&gt;" in page
    assert "&lt;b&gt;blocked&lt;/b&gt; &amp; logged" in page


@pytest.mark.slow
def test_rewrite_of_a_round_replaces_it(written, tmp_path):
    writer, records = written
    new = make_record(1, seed=5)
    new["metrics"]["train_loss"] = 0.123
    writer.write_round(new)
    assert json.loads((tmp_path / PARTY / "round_0001" / "audit.json").read_text()) == new
    rows = read_csv(tmp_path / PARTY / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [0, 1, 2]
    assert float(rows[1]["train_loss"]) == 0.123
    assert [r.seed for r in load_round_records(tmp_path / PARTY)] == [0, 5, 0]
    assert temp_files(tmp_path) == []


@pytest.mark.slow
def test_crash_in_os_replace_keeps_previous_files(written, tmp_path, monkeypatch):
    writer, records = written
    before = snapshot(tmp_path)

    def boom(src, dst):
        raise OSError("disk on fire")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk on fire"):
        writer.write_round(make_record(3))
    monkeypatch.undo()
    assert temp_files(tmp_path) == []
    after = snapshot(tmp_path)
    assert after == before  # nothing changed, not even the summaries
    assert [r.round for r in load_round_records(tmp_path / PARTY)] == [0, 1, 2]


@pytest.mark.slow
def test_crash_while_rewriting_audit_json_keeps_old_record(written, tmp_path, monkeypatch):
    writer, records = written
    old_text = (tmp_path / PARTY / "round_0001" / "audit.json").read_text()

    def boom(*args, **kwargs):
        raise RuntimeError("killed mid-dump")

    monkeypatch.setattr(json, "dumps", boom)
    with pytest.raises(RuntimeError, match="killed mid-dump"):
        writer.write_round(make_record(1, seed=9))
    monkeypatch.undo()
    assert (tmp_path / PARTY / "round_0001" / "audit.json").read_text() == old_text
    assert temp_files(tmp_path) == []
    # the summary is derived from disk: the next write repairs everything
    writer.write_round(make_record(3))
    assert [r.seed for r in load_round_records(tmp_path / PARTY)] == [0, 0, 0, 0]


@pytest.mark.slow
def test_crash_in_the_middle_of_a_png_leaves_no_temp_file(written, tmp_path, monkeypatch):
    writer, _ = written
    before = snapshot(tmp_path)

    def boom(self, *args, **kwargs):
        raise MemoryError("out of memory while rendering")

    monkeypatch.setattr(Figure, "savefig", boom)
    with pytest.raises(MemoryError):
        writer.write_round(make_record(3))
    monkeypatch.undo()
    assert temp_files(tmp_path) == []
    assert snapshot(tmp_path) == before


@pytest.mark.slow
def test_corrupt_audit_json_is_skipped(written, tmp_path, caplog):
    writer, records = written
    bad = tmp_path / PARTY / "round_0001" / "audit.json"
    bad.write_text('{"party": "collaborator1", "round": 1, "attacks": {')  # truncated
    with caplog.at_level(logging.WARNING, logger="audit.reporting.party"):
        loaded = load_round_records(tmp_path / PARTY)
    assert [r.round for r in loaded] == [0, 2]
    assert any("round_0001" in m for m in caplog.messages)
    # still summarised: a new round rebuilds from the two good ones plus itself
    writer.write_round(make_record(3))
    rows = read_csv(tmp_path / PARTY / "metrics.csv")
    assert [int(r["round"]) for r in rows] == [0, 2, 3]
    page = (tmp_path / PARTY / "index.html").read_text()
    assert "round_0002/roc.png" in page and "round_0001/roc.png" not in page


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe garbage", b"[1, 2, 3]", b'{"party": "collaborator1", "round": 1, "attacks": {}, "metrics": {"x": NaN}}',
     b'{"party": "collaborator1", "round": 4, "attacks": {}, "metrics": {}}'],  # round 4 stored in round_0001
    ids=["binary", "not-a-dict", "nan-metric", "misplaced"],
)
@pytest.mark.slow
def test_invalid_audit_json_variants_are_skipped(written, tmp_path, content, caplog):
    (tmp_path / PARTY / "round_0001" / "audit.json").write_bytes(content)
    with caplog.at_level(logging.WARNING, logger="audit.reporting.party"):
        assert [r.round for r in load_round_records(tmp_path / PARTY)] == [0, 2]
    assert caplog.messages


def test_load_round_records_of_missing_dir_is_empty(tmp_path):
    assert load_round_records(tmp_path / "nobody") == []


def _mutate(path, value):
    def apply(rec):
        target = rec
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return rec

    return apply


_DELETE = object()


@pytest.mark.parametrize(
    "mutate, field",
    [
        (_mutate(["round"], -1), "round"),
        (_mutate(["round"], "3"), "round"),
        (_mutate(["round"], True), "round"),
        (_mutate(["round"], 1.0), "round"),
        (_mutate(["round"], _DELETE), "round"),
        (_mutate(["party"], _DELETE), "party"),
        (_mutate(["party"], "collaborator2"), "party"),
        (_mutate(["attacks"], _DELETE), "attacks"),
        (_mutate(["attacks"], [1, 2]), "attacks"),
        (_mutate(["attacks", "local"], "oops"), "attacks.local"),
        (_mutate(["attacks", "local", "loss", "auc"], float("nan")), "attacks.local.loss.auc"),
        (_mutate(["attacks", "local", "loss", "exact_auc"], "0.7"), "attacks.local.loss.exact_auc"),
        (_mutate(["attacks", "local", "loss", "fpr"], [0.0, 1.5]), "attacks.local.loss.fpr[1]"),
        (_mutate(["attacks", "global", "logits", "thresholds", 0], float("inf")), "attacks.global.logits.thresholds[0]"),
        (_mutate(["metrics"], _DELETE), "metrics"),
        (_mutate(["metrics"], [0.5]), "metrics"),
        (_mutate(["metrics", "train_loss"], float("nan")), "train_loss"),
        (_mutate(["metrics", "train_loss"], float("inf")), "train_loss"),
        (_mutate(["metrics", "train_loss"], "0.3"), "train_loss"),
        (_mutate(["metrics", "train_loss"], None), "train_loss"),
        (_mutate(["metrics", "train_loss"], True), "train_loss"),
        (_mutate(["settings"], "nope"), "settings"),
        (_mutate(["extra", "bad"], float("nan")), "extra.bad"),
    ],
)
def test_validation_errors_name_the_field(tmp_path, mutate, field):
    rec = mutate(make_record(0))
    with pytest.raises(ValueError) as info:
        ReportWriter(tmp_path, PARTY).write_round(rec)
    assert field in str(info.value)
    assert not (tmp_path / PARTY / "round_0000").exists()  # nothing written
    assert temp_files(tmp_path) == []


def test_record_must_be_a_dict(tmp_path):
    with pytest.raises(ValueError, match="record"):
        ReportWriter(tmp_path, PARTY).write_round([1, 2])


def test_validate_record_accepts_a_good_record_and_numpy_numbers():
    rec = make_record(2)
    validate_record(rec, party=PARTY)
    rec["metrics"]["np_metric"] = np.float32(0.25)
    rec["round"] = np.int64(2)
    validate_record(rec)


@pytest.mark.parametrize("party", ["../evil", "a/b", "..", ".", "", "a\\b", "x..y", ".hidden", "a\x00b", "a b", 3])
def test_unsafe_party_name_is_refused(tmp_path, party):
    with pytest.raises(ValueError, match="party"):
        ReportWriter(tmp_path, party)
    assert list(tmp_path.iterdir()) == []


def test_unsafe_party_name_in_record_is_refused(tmp_path):
    rec = make_record(0, party="../evil")
    with pytest.raises(ValueError, match="party"):
        ReportWriter(tmp_path, PARTY).write_round(rec)


@pytest.mark.slow
def test_both_aucs_shown_and_named_with_twenty_population_samples(tmp_path, saved_figures):
    """Issue 10, defect 3: with 20 population samples Privacy Meter's grid AUC reads 0.681 where the
    members-vs-non-members AUC is 0.756; the report shows both, each under its own name, and plots the exact one."""
    rng = np.random.default_rng(0)
    members, nonmembers, population = rng.normal(-1, 1, 500), rng.normal(0, 1, 500), rng.normal(0, 1, 20)
    result = population_attack(members, nonmembers, population, TOLERANCES)
    rec = make_record(0, models=())
    rec["attacks"] = {"local": {"loss": result.to_dict()}}
    rec["metrics"] = {"mia_local_loss_auc": result.auc, "mia_local_loss_exact_auc": result.exact_auc}
    ReportWriter(tmp_path, PARTY).write_round(rec)

    page = (tmp_path / PARTY / "index.html").read_text()
    head = page[page.index("<tr><th>model / signal</th>"):]
    head = head[:head.index("</tr>")]
    assert ("<th>exact AUC [95% CI]</th><th>grid AUC (Privacy Meter)</th><th>TPR @ FPR ≤ 0.01 [95% CI]</th>"
            in head)
    row = page[page.index("<tr><td>local / loss</td>"):]
    cells = row[:row.index("</tr>")].split("</td>")
    interval = auc_interval(-members, -nonmembers)  # on scores where higher = member
    assert cells[1] == f"<td>0.7559 [{interval.lower:.3g}, {interval.upper:.3g}]" and cells[2] == "<td>0.6813"
    assert f"{result.exact_auc:.4g}" == "0.7559" and f"{result.auc:.4g}" == "0.6813"
    assert "Grid AUC: Privacy Meter" in page and "those ending in _exact_auc the exact one" in page

    (line,) = [ln for ln in saved_figures["auc.png"].axes[0].get_lines() if ln.get_label() == "local / loss"]
    assert list(line.get_ydata()) == [result.exact_auc]
    labels = [t.get_text() for t in saved_figures["roc.png"].axes[0].get_legend().get_texts()]
    assert "loss (grid AUC 0.681, exact 0.756)" in labels


@pytest.mark.slow
def test_intervals_counts_and_unresolvable_tolerances_are_reported(tmp_path, saved_figures):
    """Issue 12: every figure with its interval and counts, in the page, metrics.csv and the plots' bands; a tolerance
    below 1/population is marked unresolvable. 90 members, 404 non-members and 404 population samples (the demo's
    sizes): FPR 0.001 cannot be resolved, 0.01 can."""
    from audit.membership.step import scalar_metrics
    from audit.membership.uncertainty import clopper_pearson

    rng = np.random.default_rng(12)
    members, nonmembers, population = rng.normal(-0.8, 1, 90), rng.normal(0, 1, 404), rng.normal(0, 1, 404)
    result = population_attack(members, nonmembers, population, (0.001, 0.01))
    rec = make_record(0, models=())
    rec["settings"]["fpr_tolerance"] = [0.001, 0.01]
    rec["attacks"] = {"local": {"loss": result.to_dict()}}
    rec["metrics"] = scalar_metrics({"local": {"loss": result}})
    writer = ReportWriter(tmp_path, PARTY, log_scale=False)
    writer.write_round(rec)

    flagged = int((members < result.threshold_at_fpr[0.01]).sum())
    flagged_non = int((nonmembers < result.threshold_at_fpr[0.01]).sum())
    assert result.tpr_at_fpr[0.01] == flagged / 90
    tpr = clopper_pearson(flagged, 90)
    rows = list(csv.DictReader((tmp_path / PARTY / "metrics.csv").open()))
    assert float(rows[0]["mia_local_loss_tpr_at_fpr_0.01_lower"]) == pytest.approx(tpr.lower, abs=1e-15)
    assert float(rows[0]["mia_local_loss_tpr_at_fpr_0.01_upper"]) == pytest.approx(tpr.upper, abs=1e-15)
    interval = auc_interval(-members, -nonmembers)
    assert float(rows[0]["mia_local_loss_exact_auc_lower"]) == pytest.approx(interval.lower, abs=1e-15)

    page = (tmp_path / PARTY / "index.html").read_text()
    row = page[page.index("<tr><td>local / loss</td>"):]
    cells = row[:row.index("</tr>")].split("</td>")
    assert f"{flagged}/90 members, {flagged_non}/404 non-members" in cells[4]  # TPR @ 0.01
    assert f"[{tpr.lower:.3g}, {tpr.upper:.3g}]" in cells[4] and "*" not in cells[4]
    assert "unresolvable" in cells[3] and ">*</sup>" in cells[3]  # TPR @ 0.001: 404 population samples cannot
    assert "the population has fewer than 1/t samples" in page
    # ... and gets no plot of its own (the figure is the TPR at population FPR 0 whatever the tolerance); 0.01 does
    assert "TPR at FPR ≤ 0.001 is not plotted: 404 population samples cannot resolve it" in page
    assert not (tmp_path / PARTY / "tpr_at_0.001.png").exists() and "tpr_at_0.001.png" not in saved_figures
    assert (tmp_path / PARTY / "tpr_at_0.01.png").is_file()
    assert cells[-2] == "<td>90 / 404 / 404"

    stored = json.loads((tmp_path / PARTY / "round_0000" / "audit.json").read_text())["attacks"]["local"]["loss"]
    at = stored["uncertainty"]["at_fpr"]
    assert at["0.001"]["resolvable"] is False and at["0.01"]["resolvable"] is True
    assert at["0.01"]["tpr"]["k"] == flagged and at["0.01"]["fpr"]["k"] == flagged_non
    assert at["0.001"]["population_fpr"] == 0.0 and at["0.01"]["population_fpr"] == 4 / 404

    # The plots show the intervals as error bars: the AUC's spans its interval, the TPR's Clopper-Pearson's.
    for name, (low, high) in (("auc.png", (interval.lower, interval.upper)), ("tpr_at_0.01.png", (tpr.lower, tpr.upper))):
        (bars,) = saved_figures[name].axes[0].collections
        (segment,) = bars.get_segments()
        assert tuple(segment[:, 1]) == pytest.approx((low, high)), name


@pytest.mark.slow
def test_record_without_exact_auc_still_renders(tmp_path, saved_figures):
    rec = make_record(0, models=("local",))
    for a in rec["attacks"]["local"].values():
        del a["exact_auc"]  # a record written before the exact AUC existed
    ReportWriter(tmp_path, PARTY).write_round(rec)
    assert "<td>local / loss</td><td>–</td>" in (tmp_path / PARTY / "index.html").read_text()
    labels = [t.get_text() for t in saved_figures["roc.png"].axes[0].get_legend().get_texts()]
    assert any(label.startswith("loss (grid AUC ") and label.endswith(")") and "exact" not in label
               for label in labels)


@pytest.mark.slow
def test_log_scale_plots_with_zeros(tmp_path):
    writer = ReportWriter(tmp_path, PARTY, log_scale=True)
    rec = make_record(0)
    assert rec["attacks"]["local"]["loss"]["fpr"][0] == 0.0  # sklearn curves start at (0, 0)
    # a useless attack: TPR 0 everywhere except the end, TPR@FPR 0 at every tolerance
    flat = rec["attacks"]["global"]["loss"]
    flat["fpr"], flat["tpr"] = [0.0, 0.0, 0.5, 1.0], [0.0, 0.0, 0.0, 1.0]
    flat["auc"] = 0.25
    flat["tpr_at_fpr"] = {k: 0.0 for k in flat["tpr_at_fpr"]}
    writer.write_round(rec)
    writer.write_round(make_record(1))
    for png in (tmp_path / PARTY).rglob("*.png"):
        assert_png(png)
    assert temp_files(tmp_path) == []


@pytest.mark.slow
def test_only_local_model_and_missing_curves(tmp_path):
    writer = ReportWriter(tmp_path, PARTY)
    rec = make_record(0, models=("local",))
    rec["attacks"]["local"]["logits"] = {"attack": "population", "signal": "logits", "auc": None}  # no curve
    writer.write_round(rec)
    assert_png(tmp_path / PARTY / "round_0000" / "roc.png")
    assert_png(tmp_path / PARTY / "auc.png")


@pytest.mark.slow
def test_empty_attacks_round(tmp_path):
    rec = make_record(0)
    rec["attacks"], rec["metrics"] = {}, {"train_loss": 0.5}
    ReportWriter(tmp_path, PARTY).write_round(rec)
    assert_png(tmp_path / PARTY / "round_0000" / "roc.png")
    assert read_csv(tmp_path / PARTY / "metrics.csv") == [{"round": "0", "train_loss": "0.5"}]


@pytest.mark.slow
def test_tpr_plots_follow_the_settings(tmp_path):
    writer = ReportWriter(tmp_path, PARTY)
    writer.write_round(make_record(0))
    assert (tmp_path / PARTY / "tpr_at_0.5.png").exists()
    rec = make_record(0)
    rec["settings"]["fpr_tolerance"] = [0.001, 0.1]
    writer.write_round(rec)  # replaces the only round: tolerances change
    names = sorted(p.name for p in (tmp_path / PARTY).glob("tpr_at_*.png"))
    assert names == ["tpr_at_0.001.png", "tpr_at_0.1.png"]


@pytest.mark.slow
def test_rebuild_summary_from_disk_only(written, tmp_path):
    _, records = written
    (tmp_path / PARTY / "metrics.csv").unlink()
    (tmp_path / PARTY / "auc.png").unlink()
    fresh = ReportWriter(tmp_path, PARTY)  # e.g. after a restart
    fresh.rebuild_summary()
    assert len(read_csv(tmp_path / PARTY / "metrics.csv")) == 3
    assert_png(tmp_path / PARTY / "auc.png")


@pytest.mark.slow
def test_many_rounds_leave_no_figures_open(tmp_path):
    writer = ReportWriter(tmp_path, PARTY)
    rec = make_record(0, models=("local",))
    for r in range(4):
        rec = copy.deepcopy(rec)
        rec["round"] = r
        writer.write_round(rec)
    assert plt.get_fignums() == []
    assert len(read_csv(tmp_path / PARTY / "metrics.csv")) == 4


# ----------------------------------------------------------------------------------------------
# atomic_io


def test_atomic_write_json_sorted_and_rejects_nan(tmp_path):
    path = tmp_path / "sub" / "dir" / "x.json"
    atomic_io.atomic_write_json(path, {"b": 1, "a": [1.5, None]})
    assert path.read_text() == '{\n  "a": [\n    1.5,\n    null\n  ],\n  "b": 1\n}\n'
    with pytest.raises(ValueError) as info:
        atomic_io.atomic_write_json(path, {"a": float("nan")})
    assert str(path) in str(info.value)
    assert json.loads(path.read_text()) == {"b": 1, "a": [1.5, None]}  # previous file intact
    assert temp_files(tmp_path) == []


def test_atomic_write_text_and_bytes(tmp_path):
    p = atomic_io.atomic_write_text(tmp_path / "a" / "t.txt", "héllo\n")
    assert p.read_text(encoding="utf-8") == "héllo\n"
    assert (p.stat().st_mode & 0o777) == 0o666 & ~atomic_io.current_umask()
    atomic_io.atomic_write_bytes(p, b"\x00\x01")
    assert p.read_bytes() == b"\x00\x01"
    assert temp_files(tmp_path) == []


def test_atomic_savefig_failure_keeps_previous_image(tmp_path):
    fig = Figure(figsize=(2, 2), dpi=50)
    fig.add_subplot().plot([0, 1], [0, 1])
    path = atomic_io.atomic_savefig(fig, tmp_path / "f.png")
    before = path.read_bytes()
    with pytest.raises(ValueError):
        atomic_io.atomic_savefig(fig, path, format="no-such-format")
    assert path.read_bytes() == before
    assert temp_files(tmp_path) == []


@pytest.mark.slow
def test_metrics_csv_escapes_formula_like_names_but_keeps_negative_numbers(tmp_path):
    rec = make_record(0)
    rec["metrics"].update({"=HYPERLINK(\"http://x\")": -0.5, "@SUM(A1)": 2, "-2+3": -1e-300, "train_loss": -0.25})
    ReportWriter(tmp_path, PARTY).write_round(rec)
    text = (tmp_path / PARTY / "metrics.csv").read_text()
    header, row = text.splitlines()
    assert '"\'=HYPERLINK(""http://x"")"' in header and ",'@SUM(A1)," in header and ",'-2+3," in header
    values = read_csv(tmp_path / PARTY / "metrics.csv")[0]
    assert values["'=HYPERLINK(\"http://x\")"] == "-0.5" and values["'@SUM(A1)"] == "2"
    assert values["'-2+3"] == "-1e-300" and values["train_loss"] == "-0.25"  # numbers stay numbers


# ----------------------------------------------------------------------------------------------
# who may read a report: per-sample files their owner only, the rest as the umask says


@pytest.fixture
def umask():
    def set_mask(mask):
        os.umask(mask)
    previous = os.umask(0o022)
    os.umask(previous)
    yield set_mask
    os.umask(previous)


@pytest.mark.parametrize("mask", [0o022, 0o077, 0o002], ids=lambda mask: f"umask{mask:03o}")
def test_report_files_follow_the_umask(tmp_path, umask, mask):
    """Before: every report file was forced to 0644, whatever the umask (0o077 too)."""
    umask(mask)
    assert atomic_io.current_umask() == mask
    text = atomic_io.atomic_write_text(tmp_path / f"{mask:o}.txt", "x")
    fig = Figure(figsize=(1, 1), dpi=20)
    png = atomic_io.atomic_savefig(fig, tmp_path / f"{mask:o}.png")
    for path in (text, png):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, (oct(path.stat().st_mode), oct(mask))
    path = atomic_io.atomic_write_bytes(tmp_path / f"{mask:o}.bin", b"1", private=True)
    assert path.stat().st_mode & 0o777 == 0o600
    text.chmod(0o640)  # a file replaced keeps its mode; a private one becomes 0600
    assert atomic_io.atomic_write_text(text, "y").stat().st_mode & 0o777 == 0o640
    assert atomic_io.atomic_write_bytes(text, b"w", private=True).stat().st_mode & 0o777 == 0o600


@pytest.mark.slow
def test_per_sample_files_are_private_to_the_party(tmp_path, umask):
    """signals.npz, rmia_scores.npz, Fidel's grid, and whatever else an audit step's private writer puts in the round
    folder: 0600 in a 0700 round folder, even when the step's writer itself made them readable to all. Before: 0644."""
    umask(0o022)

    def careless_writer(round_dir):  # a step's private writer that gives its file to everyone
        (round_dir / "canaries.npy").write_bytes(b"per-sample")
        (round_dir / "canaries.npy").chmod(0o644)

    def signals_writer(round_dir):
        atomic_io.atomic_write_bytes(round_dir / "signals.npz", b"scores", private=True)

    writer = ReportWriter(tmp_path, PARTY)
    for round_num, store in ((0, writer.write_round), (1, writer.store_round)):
        round_dir = store(make_record(round_num), [signals_writer, careless_writer])
        assert round_dir.stat().st_mode & 0o777 == 0o700
        for name in ("signals.npz", "canaries.npy"):
            assert (round_dir / name).stat().st_mode & 0o777 == 0o600, name
        assert (round_dir / "audit.json").stat().st_mode & 0o777 == 0o644  # the umask's
    assert (tmp_path / PARTY / "index.html").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / PARTY).stat().st_mode & 0o777 == 0o755
    # a round without private files keeps the umask's folder
    assert writer.store_round(make_record(2)).stat().st_mode & 0o777 == 0o755


@pytest.mark.slow
def test_the_audit_steps_write_their_per_sample_files_private(tmp_path, umask):
    """The built-in steps' own writers, on a real audit (membership signals, RMIA scores, Fidel's grid of the members
    an update reveals): each file 0600 in a 0700 round folder under the usual umask 022. Before: 0644."""
    import torch
    import torch.nn.functional as F

    from audit.config.audit_settings import AuditSettings
    from audit.round_audit import AuditSets, audit_round
    from src.data.datasets import load_dataset
    from src.runner.models import FCNN

    umask(0o022)
    x, y = load_dataset("digits")
    x = np.asarray(x)
    sets = AuditSets(members=(x[:40], y[:40]), nonmembers=(x[40:140], y[40:140]), population=(x[140:240], y[140:240]))
    torch.manual_seed(0)
    model = FCNN((1, 8, 8), 10)
    local = copy.deepcopy(model)
    optimizer = torch.optim.SGD(local.parameters(), lr=0.01)
    optimizer.zero_grad()
    F.cross_entropy(local(torch.as_tensor(x[:40])), torch.as_tensor(y[:40])).backward()
    optimizer.step()
    settings = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.1], "audit_global": False,
                                           "update_attack": False, "rmia": {"references": ["global"]},
                                           "fidel": {"enabled": True}}, prefix="audit")
    record = audit_round(local.eval(), model.eval(), sets, settings, party=PARTY, round_num=0, seed=0)
    round_dir = ReportWriter(tmp_path, PARTY).store_round(record.to_json(), record.private)
    assert round_dir.stat().st_mode & 0o777 == 0o700
    for name in ("signals.npz", "rmia_scores.npz", "fidel_grid.png"):
        assert (round_dir / name).stat().st_mode & 0o777 == 0o600, name
