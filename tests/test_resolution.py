"""Issue 15, "small audit sets are a warning, not a silent number": which FPR tolerances a party's sets can resolve
(audit.config.resolution), said at start per party, recorded per attack and marked in the party's page."""

from __future__ import annotations

import logging
import math
from fractions import Fraction

import numpy as np
import pytest

from audit.config.vocabulary import mia_metric, tpr_statistic
from audit.membership.population_attack import population_attack, update_attack
from audit.config.resolution import largest_count, resolution_warning, resolvable
from audit.membership.step import scalar_metrics
from audit.reporting.party import ReportWriter
from audit.reporting.readings import resolvable_at, unresolvable_metrics
from audit.round_record import SCHEMA_VERSION, AttackKey, RoundRecord
from report_drawing import without_report_drawing  # noqa: F401  (a fixture)

TOLERANCES = (0.01, 0.1, 0.5)


@pytest.mark.parametrize("n", [1, 3, 4, 7, 10, 20, 99, 100, 1000])
@pytest.mark.parametrize("t", [0.001, 0.01, 0.1, 0.2, 0.25, 0.3, 0.5, 0.7])
def test_largest_count_is_the_floor_of_n_times_the_tolerance_as_written(n, t):
    assert largest_count(n, t) == math.floor(n * Fraction(str(t)))  # 10 * 0.3 is 3, not 2
    assert resolvable(t, n) == (n * Fraction(str(t)) >= 1)


def test_only_the_population_decides_resolution():
    """The population sets the threshold; few members or non-members only widen the rates' intervals."""
    assert resolvable(0.1, 10) and not resolvable(0.1, 9)
    assert resolvable(0.25, 4) and not resolvable(0.1, 4)
    line = resolution_warning("p", {"members": 3, "nonmembers": 3, "population": 1000}, TOLERANCES)
    assert line is None


@pytest.mark.parametrize("n_population", [2, 4, 9, 10, 11, 19, 20, 99, 100, 101])
def test_a_resolvable_tolerance_is_one_where_the_population_threshold_flags_a_sample(n_population):
    """The rule against the attack's own computation: with distinct population values and ample members and
    non-members, t is resolvable exactly when the threshold at t flags some of the population (FPR > 0); where it
    is not, the population FPR reached is 0 whatever t says."""
    rng = np.random.default_rng(n_population)
    tolerances = (0.005, 0.01, 0.05, 0.1, 0.25, 0.3, 0.5)
    members, nonmembers = rng.normal(-1, 1, 400), rng.normal(0, 1, 400)
    population = rng.permutation(np.linspace(-2, 2, n_population))  # distinct: no tie hides a flagged sample
    result = population_attack(members, nonmembers, population, tolerances)
    for t in tolerances:
        assert result.resolvable[t] == (result.population_fpr_at_fpr[t] > 0), (n_population, t)
        if not result.resolvable[t]:
            assert result.population_fpr_at_fpr[t] == 0.0
    record = result.to_dict()
    assert record["resolvable"] == {f"{t:g}": result.resolvable[t] for t in tolerances}


def test_the_issues_party_of_seven_members_seven_non_members_and_four_population_samples():
    """100 collaborators on digits with the tutorial's ratios: TPR at FPR 0.1 was read off 4 samples, silently."""
    rng = np.random.default_rng(0)
    result = population_attack(rng.normal(-1, 1, 7), rng.normal(0, 1, 7), rng.normal(0, 1, 4), TOLERANCES)
    assert result.resolvable == {0.01: False, 0.1: False, 0.5: True}
    update = update_attack(*(rng.normal(0, 1, n) for n in (7, 7, 7, 7, 4, 4)), TOLERANCES)
    assert update.resolvable == {0.01: False, 0.1: False, 0.5: True}
    line = resolution_warning("collaborator7", {"members": 7, "nonmembers": 7, "population": 4}, TOLERANCES)
    assert line == ("collaborator7: 4 population samples resolve FPR tolerances >= 0.25 (1 / population); TPR at "
                    "FPR 0.01, 0.1 would be read at population FPR 0 and is marked unresolvable in the reports")
    assert resolution_warning("big", {"members": 100, "nonmembers": 100, "population": 100}, TOLERANCES) is None


def _record(round_num: int, n_population: int) -> dict:
    rng = np.random.default_rng(round_num)
    attacks = {"local": {"loss": population_attack(rng.normal(-1, 1, 150), rng.normal(0, 1, 150),
                                                   rng.normal(0, 1, n_population), TOLERANCES)}}
    return {"schema_version": SCHEMA_VERSION, "party": "alice", "round": round_num, "seed": 0,
            "settings": {"fpr_tolerance": list(TOLERANCES)},
            "timings": {}, "metrics": scalar_metrics(attacks), "sizes": {}, "extra": {},
            "attacks": {m: {s: r.to_dict() for s, r in per.items()} for m, per in attacks.items()}}


@pytest.mark.slow
def test_the_party_page_marks_unresolvable_figures_and_says_why(tmp_path):
    writer = ReportWriter(tmp_path, "alice")
    writer.write_round(_record(0, n_population=4))      # resolves 0.5 only
    writer.write_round(_record(1, n_population=200))    # resolves all three
    records = writer.load_rounds()
    assert unresolvable_metrics(records[0]) == {mia_metric("local", "loss", tpr_statistic(t)) for t in (0.01, 0.1)}
    assert unresolvable_metrics(records[1]) == set()
    loss = records[0].attack("local", "loss")
    assert [resolvable_at(loss, t) for t in TOLERANCES] == [False, False, True]

    page = (tmp_path / "alice" / "index.html").read_text()
    mark = '<sup title="unresolvable: fewer than 1/t population samples">*</sup>'
    rounds = {r: page[page.index(f'id="round_000{r}"'):] for r in (0, 1)}
    row0 = rounds[0][rounds[0].index("<tr><td>local / loss</td>"):].split("</tr>")[0].split("</td>")
    row1 = rounds[1][rounds[1].index("<tr><td>local / loss</td>"):].split("</tr>")[0].split("</td>")
    # cells: model/signal, exact AUC, grid AUC, then TPR at 0.01, 0.1, 0.5
    assert [mark in cell for cell in row0[3:6]] == [True, True, False]
    assert not any(mark in cell for cell in row1)
    assert "* Unresolvable: the population has fewer than 1/t samples" in rounds[0]
    # round 1's own part of the page (newest first: it ends where round 0's begins)
    assert "* Unresolvable" not in rounds[1].split('id="round_0000"')[0]
    # the metrics table: round 0's two TPR figures are marked, round 1's are not
    table = page[page.index("<summary>Metrics per round"):]
    assert table.count(mark) == 2 and "* Unresolvable" in table
    # metrics.csv stays numbers: the flags are in each round's audit.json
    assert "*" not in (tmp_path / "alice" / "metrics.csv").read_text()


def test_rmias_unresolvable_figures_are_marked_under_their_own_names():
    rng = np.random.default_rng(2)
    result = population_attack(rng.normal(1, 1, 150), rng.normal(0, 1, 150), rng.normal(0, 1, 4), TOLERANCES,
                               member_if_lower=False, attack="rmia", signal="independent")
    record = RoundRecord("p", 0, attacks={AttackKey("rmia", "independent"): result.to_dict()})
    assert unresolvable_metrics(record) == {"rmia_independent_tpr_at_fpr_0.01", "rmia_independent_tpr_at_fpr_0.1"}


def test_an_attack_without_the_flags_is_not_marked():
    assert resolvable_at({"tpr_at_fpr": {"0.1": 0.3}}, 0.1) is True
    assert unresolvable_metrics(RoundRecord("p", 0, attacks={AttackKey("local", "loss"): {"tpr_at_fpr": {"0.1": 0.3}}})
                                ) == set()


@pytest.mark.federation
@pytest.mark.usefixtures("without_report_drawing")  # the start lines and the records are read, not the pages
def test_each_party_says_at_start_which_tolerances_its_sets_resolve(tmp_path, caplog):
    """A federation whose parties audit a handful of samples: one warning line per party before its first training,
    and every round record flags the unresolvable tolerances."""
    from workspace.in_process import run_in_process

    overrides = {
        "data_loader": {"settings": {"dataset": "digits", "train_dataset_ratio": 0.01, "test_dataset_ratio": 0.01,
                                     "audit_dataset_ratio": 0.005}},
        "task_runner": {"settings": {"audit": {"signals": ["loss"], "fpr_tolerance": list(TOLERANCES)}}},
        "tasks": {"train": {"kwargs": {"epochs": 1}}},
    }
    with caplog.at_level(logging.WARNING, logger="src.taskrunner"):
        result = run_in_process(tmp_path, collaborators=2, rounds=2, overrides=overrides)
    lines = [r.getMessage() for r in caplog.records if "resolve FPR tolerances" in r.getMessage()]
    assert sorted(line.split(":")[0] for line in lines) == ["collaborator1", "collaborator2"]  # once per party
    for name in ("collaborator1", "collaborator2"):
        record = result.runner(name).last_record
        sizes = record.sizes
        assert sizes["population"] < 10  # too few for 0.1
        for attack in record.attacks.values():
            assert attack.to_dict()["resolvable"] == {f"{t:g}": resolvable(t, sizes["population"]) for t in TOLERANCES}
        (line,) = [ln for ln in lines if ln.startswith(name)]
        assert f"{sizes['population']} population samples" in line and "TPR at FPR 0.01, 0.1" in line
