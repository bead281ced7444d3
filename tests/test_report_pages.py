"""The report pages: every page of a real short run leads with its verdict and every link and image resolves; the
verdicts, epsilons and leak statuses read off round records; the aggregator's mean, worst and thresholds."""

import json
import re
from dataclasses import replace
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import numpy as np
import pytest
import torch

from audit.config.audit_settings import AuditSettings
from audit.config.gate import GatePolicy
from audit.gate_flow import run_gate
from audit.reporting.html import party_page
from audit.reporting.party import ReportWriter, histogram_panels
from audit.reporting.plots import plot_signal_histograms
from audit.reporting.verdicts import NO_DP, round_verdict
from audit.round_audit import AuditSets, audit_round
from audit.round_record import SCHEMA_VERSION, RoundRecord
from audit.aggregator_report.writer import AggregatorReportWriter
from audit.aggregator_report.record import round_record
from workspace.federation import report_locations, write_run_index
from workspace.in_process import run_in_process
from workspace.federation_state import FederationLayout

ROUNDS = 2


class _Links(HTMLParser):
    """Every href and src of a page, every id, and the order of the elements (tag, attrs, text)."""

    def __init__(self):
        super().__init__()
        self.links, self.ids, self.events = [], set(), []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        for key in ("href", "src"):
            if attrs.get(key) is not None:
                self.links.append((tag, key, attrs[key]))
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        self.events.append((tag, attrs))

    def handle_data(self, data):
        if data.strip():
            self.events.append(("#text", data.strip()))


def _parse(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text(encoding="utf-8"))
    return parser


def broken_links(root: Path) -> list[str]:
    """Every href / img src of every page under `root` that names a missing file or a missing anchor."""
    pages = {p.resolve(): _parse(p) for p in root.rglob("*.html")}
    broken = []
    for page, parsed in pages.items():
        for tag, key, value in parsed.links:
            parts = urlsplit(value)
            if parts.scheme or parts.netloc:
                broken.append(f"{page}: {tag} {key}={value!r} leaves the report")
                continue
            target = (page.parent / unquote(parts.path)).resolve() if parts.path else page
            if not target.is_file():
                broken.append(f"{page}: {tag} {key}={value!r}: no file {target}")
            elif parts.fragment:
                ids = pages[target].ids if target in pages else _parse(target).ids
                if unquote(parts.fragment) not in ids:
                    broken.append(f"{page}: {tag} {key}={value!r}: no anchor #{parts.fragment}")
    return broken


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """2 collaborators x 2 rounds on skewed digits with Fidel and both deanonymization audits: collaborator1's gate
    withholds every update (threshold 0), collaborator2 has no gate. The parties' and the aggregator's reports share
    one root, as the demo's --log_dir does."""
    tmp = tmp_path_factory.mktemp("pages")
    root = tmp / "reports"
    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": 1}}},
        "data_loader": {"settings": {"dataset": "digits", "seed": 3, "dirichlet_alpha": 0.3, "train_dataset_ratio": 0.1,
                                     "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}},
        "aggregator": {"settings": {"report_dir": str(root / "aggregator"), "deanon": {"enabled": True}}},
        "task_runner": {"settings": {
            "seed": 3,
            "audit": {"report_dir": str(root), "signals": ["loss"], "fpr_tolerance": [0.001, 0.01, 0.1],
                      "rmia": {"references": ["global"]}, "fidel": {"enabled": True},
                      "deanon": {"enabled": True, "crowd_users": 3, "shadows_per_user": 2, "attacks": ["knn"]}},
            "per_collaborator": {"collaborator1": {"gate": {"action": "withhold",
                                                             "thresholds": {"mia_local_loss_exact_auc": 0.0}}}},
        }},
    }
    run_in_process(tmp / "run", collaborators=2, rounds=ROUNDS, overrides=overrides)
    return root


@pytest.mark.federation
def test_every_link_and_image_of_every_page_resolves(run):
    pages = sorted(p.relative_to(run).as_posix() for p in run.rglob("*.html"))
    assert pages == ["aggregator/index.html", "collaborator1/index.html", "collaborator2/index.html", "index.html"]
    assert broken_links(run) == []
    # the run index links the aggregator's page and every party's; each links back
    index = {v for _, k, v in _parse(run / "index.html").links}
    assert {"aggregator/index.html", "collaborator1/index.html", "collaborator2/index.html"} <= index
    for page in pages[:-1]:
        assert "../index.html" in {v for _, k, v in _parse(run / page).links}, page
    # each round's private views are linked: histograms (shown) and Fidel's grid
    party = {v for _, k, v in _parse(run / "collaborator1" / "index.html").links}
    for r in range(ROUNDS):
        assert {f"round_{r:04d}/signals.png", f"round_{r:04d}/fidel_grid.png", f"#round_{r:04d}"} <= party
    aggregator = {v for _, k, v in _parse(run / "aggregator" / "index.html").links}
    assert {"deanon/ap_over_chance.png", "deanon/summary.csv", "gate_mia_local_loss_exact_auc.png"} <= aggregator


@pytest.mark.federation
def test_a_withheld_round_leads_with_its_verdict(run):
    parsed = _parse(run / "collaborator1" / "index.html")
    texts = [t for tag, t in parsed.events if tag == "#text"]
    # the page opens with its headline chart, then the verdict per round, before any other plot
    images = [a["src"] for tag, a in parsed.events if tag == "img"]
    first_other = next(i for i, (tag, a) in enumerate(parsed.events) if tag == "img" and a["src"] != "headline.png")
    verdict_heading = parsed.events.index(("#text", "Verdict per round"))
    assert images[0] == "headline.png" and verdict_heading < first_other
    for r in range(ROUNDS):
        start = next(i for i, (tag, a) in enumerate(parsed.events) if isinstance(a, dict) and a.get("id") == f"round_{r:04d}")
        section = [t for tag, t in parsed.events[start:start + 30] if tag == "#text"]
        # collapsed to one line: the round, its leak verdict and the gate's
        assert section[0] == f"Round {r}" and re.match(r"(no )?leak detected · withheld$", section[1]), section
        assert section[2] == "Leak verdict:", section
        assert re.match(r"(no )?leak detected \(\d+ tests, Holm-corrected, 95%\)", section[3]), section
        assert section[4] == "Proven:" and section[5].startswith("ε ≥ "), section
        assert section[6] == "Gate:" and section[7] == "withheld", section
        assert "above threshold: withheld" in " ".join(section)
    assert NO_DP in texts and not any(re.search(r"ε = 0(\.0)?\b", t) for t in texts)
    other = " ".join(t for tag, t in _parse(run / "collaborator2" / "index.html").events if tag == "#text")
    assert re.search(r"(no )?leak detected \(\d+ tests, Holm-corrected, 95%\)", other)
    assert "no gate set: sent as trained" in other
    agg_text = (run / "aggregator" / "index.html").read_text()
    assert "withheld" in agg_text and "gated" not in agg_text.lower()


@pytest.mark.federation
def test_histograms_come_from_the_scores_the_party_keeps(run):
    for r in range(ROUNDS):
        folder = run / "collaborator1" / f"round_{r:04d}"
        with np.load(folder / "signals.npz") as stored:
            record = json.loads((folder / "audit.json").read_text())
            assert record["attacks"]["local"]["loss"]["n_members"] == stored["local_loss_members"].size
            assert record["attacks"]["local"]["loss"]["n_nonmembers"] == stored["local_loss_nonmembers"].size
        assert (folder / "signals.png").stat().st_size > 0
    # only scalars left the party: no per-sample file in the aggregator's report
    assert not list((run / "aggregator").rglob("*.npz"))


@pytest.mark.federation
def test_the_aggregator_marks_the_figures_each_party_marks_from_the_sizes_it_sent(run):
    """Only scalars reach the aggregator: each party's population size per attack. From them and the tolerance the
    aggregator marks exactly the TPR figures the party's own report marks unresolvable (FPR 0.001 on a few hundred
    population samples), on its page too."""
    from audit.reporting.readings import unresolvable_metrics
    from audit.aggregator_report.record import unresolvable

    marked = 0
    for r in range(ROUNDS):
        record = json.loads((run / "aggregator" / f"round_{r:04d}.json").read_text())
        for name, entry in record["collaborators"].items():
            party = RoundRecord.read(run / name / f"round_{r:04d}" / "audit.json")
            sent = set(entry["audit_metrics"])
            theirs = unresolvable_metrics(party) & sent
            ours = {m for m in sent if unresolvable(entry, m)}
            assert ours == theirs, (r, name)
            marked += len(ours)
            assert set(entry["population"]) == {"mia_local_loss", "mia_global_loss", "mia_update_loss_reduction",
                                                "rmia_global"}
    assert marked >= 2 * ROUNDS * 4  # every attack of both parties at FPR 0.001
    page = (run / "aggregator" / "index.html").read_text()
    assert "*</sup>" in page and "* Unresolvable: the collaborator" in page


# ----------------------------------------------------------------------------------------------- unit, no federation

def _attack(exact_auc, tpr=(0.3, 0.2, 0.4), resolvable=True):
    rate, lower, upper = tpr
    return {"exact_auc": exact_auc, "auc": exact_auc, "n_members": 50, "n_nonmembers": 50, "n_population": 200,
            "tpr_at_fpr": {"0.01": rate}, "resolvable": {"0.01": resolvable},
            "uncertainty": {"exact_auc": {"lower": exact_auc - 0.05, "upper": exact_auc + 0.05},
                            "at_fpr": {"0.01": {"tpr": {"rate": rate, "lower": lower, "upper": upper, "k": 15,
                                                        "n": 50},
                                                "fpr": {"rate": 0.0, "lower": 0.0, "upper": 0.07, "k": 0, "n": 50},
                                                "resolvable": resolvable}}}}


def _record(gate=None, attacks=None, metrics=None, round_num=0, leak=None):
    record = {"schema_version": SCHEMA_VERSION, "party": "p", "round": round_num, "settings": {"fpr_tolerance": [0.01]},
              "attacks": attacks or {"local": {"loss": _attack(0.6)}}, "metrics": metrics or {}, "extra": {}}
    if gate is not None:
        record["extra"]["gate"] = gate
    if leak is not None:
        record["leak"] = leak
    return RoundRecord.from_json(record)


def test_a_withheld_verdict_names_the_bound_its_interval_and_the_threshold():
    gate = {"verdict": "withheld", "action": "withhold", "bound": "upper", "retries": 0, "epsilon": 0.0,
            "delta": None, "thresholds": {"m_exact_auc": 0.6},
            "compared": {"m_exact_auc": "m_exact_auc_upper"},
            "tripped": {"m_exact_auc": {"value": 0.66, "threshold": 0.6}}, "reason": "over_threshold"}
    v = round_verdict(_record(gate, metrics={"m_exact_auc": 0.61, "m_exact_auc_lower": 0.55, "m_exact_auc_upper": 0.66}))
    assert (v.verdict, v.status, v.epsilon) == ("withheld", "above threshold: withheld", NO_DP)
    (check,) = v.deciding
    assert (check.bound, check.value, check.threshold, check.tripped) == ("upper", 0.66, 0.6, True)
    assert check.text() == "m_exact_auc: upper bound 0.66 (estimate 0.61 [0.55, 0.66]) > threshold 0.6"


def test_epsilon_is_the_accountants_when_dp_ran_and_never_zero_without_it():
    base = {"action": "dp_retrain", "bound": "point", "thresholds": {"m": 0.5}, "compared": {"m": "m"},
            "tripped": {"m": {"value": 0.7, "threshold": 0.5}}, "reason": "over_threshold"}
    retrained = round_verdict(_record({**base, "verdict": "dp_retrained", "retries": 2, "epsilon": 3.25,
                                       "delta": 1e-5}, metrics={"m": 0.7}))
    # the gate's figure composes every try of the round: said so
    assert retrained.epsilon == "ε = 3.25 at δ = 1e-05 composed over the round's 2 DP tries"
    assert retrained.status.startswith("above threshold: retrained with DP")
    gave_up = round_verdict(_record({**base, "verdict": "withheld", "retries": 3, "epsilon": 8.0, "delta": 1e-5},
                                    metrics={"m": 0.7}))
    assert gave_up.epsilon == "ε = 8 at δ = 1e-05 composed over the round's 3 DP tries, none of them sent"
    assert gave_up.status == "above threshold: withheld after DP retraining did not bring it below"
    kept = round_verdict(_record({**base, "verdict": "kept", "action": "withhold", "retries": 0, "epsilon": 0.0,
                                  "tripped": {}}, metrics={"m": 0.4}))
    assert (kept.epsilon, kept.status) == (NO_DP, "below every threshold")
    assert kept.deciding[0].text() == "m: value 0.4 ≤ threshold 0.5"
    reports = round_verdict(_record({**base, "verdict": "kept", "action": "report_only", "retries": 0,
                                     "epsilon": 0.0}, metrics={"m": 0.7}))
    assert reports.status == "above threshold: kept (the gate's action is report_only: it only reports)"


LEAK = {"detected": True, "confidence": 0.95, "tests": 12, "significant": [{}, {}],
        "headline": {"attack": "rmia / independent", "statistic": "exact_auc", "estimate": 0.676, "chance": 0.5,
                     "p_adjusted": 0.0009, "interval": [0.61, 0.74], "corrected_interval": [0.58, 0.77]},
        "floor": {"members": 89, "nonmembers": 89, "exact_auc": 0.66, "tpr_at_fpr": {"0.01": 0.11, "0.1": None}},
        "epsilon": {"value": 0.31, "attack": "rmia / independent", "sources": 3, "confidence": 0.95, "delta": 1e-5,
                    "ceiling": 3.3}}


def test_the_leak_status_names_the_headline_its_intervals_chance_and_the_correction():
    record = _record(leak=LEAK)
    v = round_verdict(record)
    assert v.leak == "leak" and v.status == v.leak_text
    assert v.leak_text == ("leak detected (12 tests, Holm-corrected, 95%): rmia / independent exact AUC 0.676 "
                           "[0.61, 0.74] (corrected: [0.58, 0.77]), chance 0.5, p = 0.0009 adjusted; 1 more figure beat "
                           "chance")
    assert v.proven == ("ε ≥ 0.31 at δ = 1e-05 (95%, corrected for 3 attacks, rmia / independent; these counts prove "
                        "at most 3.3)")
    gated = round_verdict(replace(record, extra={"gate": {"verdict": "kept", "action": "withhold", "thresholds": {},
                                                          "epsilon_budget": 0.5, "retries": 0, "epsilon": 0.0}}))
    assert gated.proven.endswith("against a budget of 0.5")


def test_no_leak_detected_says_what_the_counts_could_have_detected():
    record = _record(leak={**LEAK, "detected": False, "significant": []})
    v = round_verdict(record)
    assert v.leak == "no_leak"
    assert v.leak_text == ("no leak detected (12 tests, Holm-corrected, 95%); strongest: rmia / independent exact AUC "
                           "0.676 [0.61, 0.74] (corrected: [0.58, 0.77]), chance 0.5, p = 0.0009 adjusted; these counts "
                           "(89 members, 89 non-members) could only have shown exact AUC ≥ 0.66, TPR ≥ 0.11 at FPR "
                           "0.01, nothing at FPR 0.1; an ε lower bound of at most 3.3")
    assert round_verdict(_record()).leak == "not_audited"  # a record without a leak verdict
    assert round_verdict(replace(record, leak={**LEAK, "detected": None})).leak == "not_audited"


def test_a_gate_that_failed_closed_says_which_metric_was_missing():
    gate = {"verdict": "withheld", "action": "withhold", "bound": "upper", "retries": 0, "epsilon": 0.0,
            "thresholds": {"rmia_global_exact_auc": 0.6}, "compared": {"rmia_global_exact_auc": "rmia_global_exact_auc_upper"},
            "tripped": {"rmia_global_exact_auc": {"value": None, "threshold": 0.6}},
            "missing": ["rmia_global_exact_auc"], "reason": "missing: rmia_global_exact_auc"}
    v = round_verdict(_record(gate))
    assert v.status.startswith("withheld: missing: rmia_global_exact_auc (fail closed")
    (check,) = v.checks
    assert check.missing and check.text().startswith("rmia_global_exact_auc: missing")


def test_an_auc_below_half_is_flagged_on_the_page_and_in_the_plot(tmp_path):
    record = _record(attacks={"local": {"loss": _attack(0.31)}})
    page = party_page("p", [record], [0.01], [], True)
    assert "below 0.5: signal direction wrong, not a safer model" in page
    assert "local / loss 0.31 [0.26, 0.36]" in page
    # tabular-like data, members scoring higher than non-members on a lower-is-member signal: AUC < 0.5
    rng = np.random.default_rng(0)
    round_dir = tmp_path / "round_0000"
    round_dir.mkdir()
    np.savez(round_dir / "signals.npz", local_loss_members=rng.normal(2.0, 1.0, 50),
             local_loss_nonmembers=rng.normal(0.0, 1.0, 50))
    panels = histogram_panels(record, round_dir)  # the membership step's, read from its private file
    assert [(p.title, p.auc) for p in panels] == [("local model / loss", 0.31)]
    assert plot_signal_histograms(record, panels, tmp_path / "h.png") and (tmp_path / "h.png").stat().st_size > 0
    assert not plot_signal_histograms(record, [], tmp_path / "none.png") and not (tmp_path / "none.png").exists()


def test_the_aggregator_reports_mean_worst_threshold_and_dp_retrained(tmp_path):
    (tmp_path / "index.html").write_text("run index")  # a run root: the page links back, the index is rebuilt
    sent = {"a": {"gate_kept": 1.0, "gate_retries": 0.0, "gate_epsilon": 0.0, "mia_x_auc": 0.52,
                  "gate_tripped__mia_x_auc": 0.0, "gate_threshold__mia_x_auc": 0.6},
            "b": {"gate_kept": 1.0, "gate_retries": 2.0, "gate_epsilon": 4.5, "mia_x_auc": 0.71,
                  "gate_tripped__mia_x_auc": 0.0, "gate_threshold__mia_x_auc": 0.6},
            "c": {"gate_kept": 0.0, "gate_retries": 0.0, "gate_epsilon": 0.0, "mia_x_auc": 0.65,
                  "gate_tripped__mia_x_auc": 0.74, "gate_threshold__mia_x_auc": 0.6}}
    record = round_record(0, authorized=["a", "b", "c"], stragglers=[], metrics=sent)
    entries = record["collaborators"]
    assert [entries[n]["verdict"] for n in "abc"] == ["kept", "dp_retrained", "withheld"]
    assert [entries[n]["status"] for n in "abc"] == ["kept", "kept", "withheld"]  # what the average did
    assert entries["c"]["thresholds"] == {"mia_x_auc": 0.6}
    assert record["averaged_audit_metrics"]["mia_x_auc"] == {
        "mean": pytest.approx((0.52 + 0.71 + 0.65) / 3), "n": 3, "worst_value": 0.71, "worst": "b", "worse": "higher"}
    (tmp_path / "aggregator").mkdir()
    AggregatorReportWriter(tmp_path / "aggregator").write_round(record)
    page = (tmp_path / "aggregator" / "index.html").read_text()
    assert "0.65; compared 0.74 &gt; 0.6 (tripped)" in page and "0.52; passed (≤ 0.6)" in page
    assert "dp_retrained" in page and "gated" not in page.lower()
    assert (tmp_path / "aggregator" / "gate_mia_x_auc.png").stat().st_size > 0
    assert "aggregator/index.html" in (tmp_path / "index.html").read_text()
    assert broken_links(tmp_path) == []
    csv_text = (tmp_path / "aggregator" / "metrics.csv").read_text().splitlines()
    assert csv_text[0].endswith("mia_x_auc,worst:mia_x_auc") and csv_text[1].endswith(",0.71")


# ------------------------------------------------------------------- the run index of `python -m workspace run`

def _tabular_sets(rng):
    def make(n):
        return rng.normal(size=(n, 5)).astype(np.float32), rng.integers(0, 2, size=n)

    return AuditSets(members=make(40), nonmembers=make(40), population=make(60))


@pytest.mark.slow
def test_a_multi_process_run_index_links_every_page_and_each_page_links_back_to_it(tmp_path):
    """The layout of `python -m workspace run` (each participant's report in its own workspace folder), filled with
    real round records: an audited tabular model per collaborator, collaborator1's gate withholding every update,
    the aggregator's record of what it averaged. The run index in the federation folder links every page; each
    page's back link reaches an index that links every page too."""
    names = ["collaborator1", "collaborator2"]
    layout = FederationLayout(run_dir=str(tmp_path / "run"), collaborators=names, rounds=ROUNDS, port=1,
                              use_tls=False, aggregator_report_dir="reports/aggregator", collaborator_report_dir="reports")
    write_run_index(layout)  # as `start` does before the participants start
    reports = report_locations(layout)
    settings = AuditSettings.from_mapping({"signals": ["loss"], "fpr_tolerance": [0.1], "rmia": {"enabled": False}},
                                          prefix="task_runner.settings.audit")
    policy = GatePolicy.from_mapping({"action": "withhold", "thresholds": {"mia_local_loss_exact_auc": 0.0},
                                      "epsilon_budget": 2.0}, audit_settings=settings)
    rng = np.random.default_rng(5)
    torch.manual_seed(5)
    latest = {}
    for r in range(ROUNDS):
        sent = {}
        for name in names:
            local, received = (torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2))
                               for _ in range(2))
            record = audit_round(local, received, _tabular_sets(rng), settings, party=name, round_num=r, seed=r)
            scalars = {}
            if name == "collaborator1":
                outcome = run_gate(policy, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: record,
                                   audit_received=lambda: record, empty_record=None, retrain=None,
                                   audit_retrained=None)
                record.extra["gate"] = outcome.record_entry(policy)
                scalars = outcome.scalars(("leak_epsilon_lb", "mia_local_loss_exact_auc"), policy.limits)
            latest[name] = RoundRecord.from_json(record.to_json())  # as the run index reads it back
            ReportWriter(reports[name].parent, name).write_round(record)
            sent[name] = {**record.metrics, **scalars}
        AggregatorReportWriter(reports["aggregator"]).write_round(
            round_record(r, authorized=names, stragglers=[], metrics=sent))
    index = write_run_index(layout)  # as `start` does at the end of the run

    assert index == layout.root / "index.html"
    assert broken_links(layout.root) == []
    pages = {(reports[name] / "index.html").resolve() for name in reports}
    index_links = {(index.parent / unquote(v)).resolve() for _, k, v in _parse(index).links}
    assert pages <= index_links
    for page in pages:  # each page's back link leads to a run index that links every page, itself included
        back = (page.parent / "../index.html").resolve()
        assert "../index.html" in {v for _, k, v in _parse(page).links}, page
        assert pages <= {(back.parent / unquote(v)).resolve() for _, k, v in _parse(back).links}, back
    # each party's leak verdict of each round, coloured, with the gate's verdict, as its page reads them off its records
    rows = index.read_text().replace("&#x27;", "'")
    for name in names:
        v = round_verdict(latest[name])
        assert f'<td class="text cell-{v.leak}" title="{v.leak_text}">' in rows, (name, v.leak_text)
    assert (round_verdict(latest["collaborator1"]).verdict == "withheld"
            and '<span class="withheld">withheld: nothing sent</span>' in rows)
    assert '<span class="kept">sent as trained (no gate)</span>' in rows
    assert "withheld: collaborator1" in rows and "kept: collaborator2" in rows  # the aggregator's latest round
    # the aggregator's page: each collaborator's leak verdict beside its gate's, and the warning that every update of
    # collaborator1 stayed out of the average
    aggregator = (reports["aggregator"] / "index.html").read_text()
    assert "every update of collaborator1 was kept out of the average in all 2 rounds" in aggregator
    assert aggregator.count("leak detected") + aggregator.count("no leak detected") >= 2 * ROUNDS
