"""The RMIA step (audit.membership.rmia_step): its plan section, its scores against RMIA computed by hand on the same
models, its references (trained once per round, the independent ones continued across rounds), its metrics, the gate
acting on them and the party's report showing them (per-sample scores only in the party's round folder).

A tabular task (scikit-learn's make_classification, 12 features, 3 classes) and an MLP with BatchNorm: 60 members
trained on hard, 150 non-members, 200 population samples."""

from __future__ import annotations

import copy
import csv
import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from sklearn.datasets import make_classification
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.config.fields import SettingsError
from audit.config.gate import GatePolicy, audit_metric_names
from audit.config.rmia_settings import GLOBAL_A, RMIASettings
from audit.gate_flow import WITHHELD, run_gate
from audit.membership.population_attack import population_attack
from audit.membership.rmia import OFFLINE_A_GRID, Signals, rmia, true_class_probability, tune_offline_a
from audit.membership.rmia_step import tuned_a
from audit.reporting.party import ReportWriter
from audit.round_audit import AuditSets, LocalTraining, audit_round
from audit.training import TrainingRecipe

RECIPE = TrainingRecipe("Adam", 0.01, 0.9, epochs=30, batch_size=20)
TRAINING = LocalTraining(RECIPE, member_count=60, federation_alpha=None)


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def task():
    x, y = make_classification(n_samples=410, n_features=12, n_informative=6, n_classes=3, flip_y=0.1, random_state=4)
    x, y = x.astype(np.float32), y.astype(np.int64)
    return AuditSets(members=(x[:60], y[:60]), nonmembers=(x[60:210], y[60:210]), population=(x[210:], y[210:]))


def net(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 3))


def trained(model: nn.Module, sets: AuditSets, epochs: int = 30) -> nn.Module:
    local = copy.deepcopy(model).train()
    optimizer = torch.optim.Adam(local.parameters(), lr=0.01)
    x, y = (torch.as_tensor(a) for a in sets.members)
    generator = torch.Generator().manual_seed(0)
    for _ in range(epochs):
        order = torch.randperm(60, generator=generator)
        for start in range(0, 60, 20):
            batch = order[start:start + 20]
            optimizer.zero_grad()
            F.cross_entropy(local(x[batch]), y[batch]).backward()
            optimizer.step()
    return local.eval()


def settings(**rmia) -> AuditSettings:
    return AuditSettings(signals=("loss",), fpr_tolerance=(0.01, 0.1), audit_global=False, update_attack=False,
                         sections={"rmia": rmia})


def probabilities(model, sets, temperature=2.0):
    with torch.no_grad():
        model.eval()
        return {name: true_class_probability(model(torch.as_tensor(getattr(sets, name)[0])).double().numpy(),
                                             getattr(sets, name)[1], temperature)
                for name in ("members", "nonmembers", "population")}


# ------------------------------------------------------------------------------------------ settings


def test_the_plan_section_is_parsed_and_checked_by_its_dotted_key():
    parsed = AuditSettings.from_mapping({"rmia": {"references": ["independent"], "reference_models": 4,
                                                  "offline_a": 0.2, "gamma": 2, "temperature": 1}})
    assert parsed.rmia == RMIASettings(references=("independent",), reference_models=4, offline_a=0.2, gamma=2.0,
                                       temperature=1.0)
    assert AuditSettings.from_mapping(parsed.to_dict()) == parsed
    for value, key, words in [
        ({"references": []}, "references", "non-empty list"),
        ({"references": ["global", "shadow"]}, "references", "unknown kind of reference 'shadow'"),
        ({"references": ["global", "global"]}, "references", "listed twice"),
        ({"reference_models": 0}, "reference_models", ">= 1"),
        ({"offline_a": 1.5}, "offline_a", "[0, 1] or 'tune'"),
        ({"offline_a": "auto"}, "offline_a", "[0, 1] or 'tune'"),
        ({"gamma": 0}, "gamma", "> 0"),
        ({"temperature": float("inf")}, "temperature", "> 0"),
        ({"interval": 0}, "interval", ">= 1"),
        ({"reference_budget": 0}, "reference_budget", "> 0 or null"),
        ({"reference_budget": "one"}, "reference_budget", "> 0 or null"),
        ({"samples": 3}, "samples", "unknown setting"),
    ]:
        with pytest.raises(SettingsError) as err:
            AuditSettings.from_mapping({"rmia": value}, prefix="task_runner.settings.audit")
        assert str(err.value).startswith(f"task_runner.settings.audit.rmia.{key}:") and words in str(err.value)


# ------------------------------------------------------------------------------------------ the scores


@pytest.mark.slow
def test_the_step_is_rmia_on_the_models_it_audits():
    """Every kind's scores are audit.membership.rmia's on probabilities computed here from the same models (the
    global model; the references the step trained, read back from the party's store), and its figures are the
    population attack's on those scores."""
    sets, initial = task(), net(0)
    received = trained(initial, sets, epochs=3)  # a global model that has seen the members a little
    local = trained(received, sets)
    store = {}
    audit = settings(references=["global", "fine_tuned", "independent"], reference_models=2)
    record = audit_round(local, received, sets, audit, party="p", round_num=2, seed=5, training=TRAINING,
                         initial_model=initial, store=store)
    target, glob = probabilities(local, sets), probabilities(received, sets)
    names = ("members", "nonmembers", "population")

    direct = rmia(*(Signals(target[n], global_model=glob[n]) for n in names), offline_a=GLOBAL_A, gamma=1.0)
    found = record.attack("rmia", "global")
    expected = population_attack(direct.members, direct.nonmembers, direct.population, (0.01, 0.1),
                                 member_if_lower=False, confidence=0.95, delta=1e-5)
    assert found.exact_auc == expected.exact_auc and found.tpr_at_fpr == expected.tpr_at_fpr
    assert record.metrics["rmia_global_tpr_at_fpr_0.1_upper"] == expected.uncertainty.at_fpr[0.1].tpr.upper

    for kind in ("fine_tuned", "independent"):
        refs = store["rmia"]["trained"][kind]
        probs = {n: true_class_probability(refs.copies.logits(getattr(sets, n)[0]), getattr(sets, n)[1], 2.0)
                 for n in names}
        a, tuning = tuned_a(probs["population"], refs.population_in, 1.0)
        assert tuning["tuned"] and record.extra["rmia"][kind]["offline_a"] == a
        direct = rmia(Signals(target["members"], probs["members"]), Signals(target["nonmembers"], probs["nonmembers"]),
                      Signals(target["population"], probs["population"], refs.population_in), offline_a=a)
        assert record.attack("rmia", kind).exact_auc == pytest.approx(
            population_attack(direct.members, direct.nonmembers, direct.population, (0.1,),
                              member_if_lower=False).exact_auc, abs=1e-15)
        assert refs.population_in.sum(axis=1).tolist() == [60, 60]  # subsets of the member count
        assert not (refs.population_in[0] & refs.population_in[1]).any()  # 2 x 60 of 200: disjoint


def test_a_is_tuned_as_privacy_meter_v2_does_averaged_over_the_stand_in_targets():
    rng = np.random.default_rng(3)
    trained_on = np.zeros((3, 90), dtype=bool)
    for k in range(3):
        trained_on[k, rng.choice(90, 30, replace=False)] = True
    difficulty = rng.random(90)
    refs = np.clip(np.where(trained_on, 0.6 * difficulty + 0.4, difficulty) + rng.normal(0, 0.05, (3, 90)), 1e-3, 1)
    a, tuning = tuned_a(refs, trained_on, 1.0)
    per = [tune_offline_a(refs, trained_on, refs, trained_on, paired=p) for p in range(3)]
    mean = {c: np.mean([t.aucs[c] for t in per]) for c in OFFLINE_A_GRID}
    assert a == max(OFFLINE_A_GRID, key=lambda c: (mean[c], -c)) and tuning["targets"] == 3
    assert tuning["mean_auc"][f"{a:g}"] == pytest.approx(mean[a])


# ------------------------------------------------------------------------------------------ references


def test_a_reference_budget_shares_b_local_trainings_among_the_k_references():
    """reference_budget b: each of the K references trains on b x the member count / K population samples (at
    least 1), so the K together cost b local trainings a round; null keeps each on the member count."""
    assert RMIASettings(reference_models=4).reference_size(60) == 60
    assert RMIASettings(reference_models=4, reference_budget=1).reference_size(60) == 15
    assert RMIASettings(reference_models=2, reference_budget=1.5).reference_size(60) == 45
    assert RMIASettings(reference_models=4, reference_budget=0.01).reference_size(60) == 1
    sets, initial = task(), net(0)
    received = trained(initial, sets, epochs=3)
    local = trained(received, sets)
    store = {}
    audit = settings(references=["independent"], reference_models=2, reference_budget=1)
    record = audit_round(local, received, sets, audit, party="p", round_num=0, seed=5, training=TRAINING,
                         initial_model=initial, store=store)
    refs = store["rmia"]["trained"]["independent"]
    assert refs.population_in.sum(axis=1).tolist() == [30, 30]  # 2 x 30 = the 60 members: one local training
    assert not refs.population_in.all(axis=0).any()  # disjoint: every population sample has an OUT reference
    assert record.extra["rmia"]["independent"]["subset_size"] == 30 and "rmia_independent_exact_auc" in record.metrics


@pytest.mark.slow
def test_references_are_trained_once_per_round_and_the_independent_ones_continue_across_rounds():
    sets, initial = task(), net(0)
    received = trained(initial, sets, epochs=3)
    local = trained(received, sets)
    store, audit = {}, settings(references=["fine_tuned", "independent"], offline_a=0.3, reference_models=2)

    def audit_at(round_num, model=local):
        return audit_round(model, received, sets, audit, party="p", round_num=round_num, seed=5, training=TRAINING,
                           initial_model=initial, store=store)

    first = audit_at(0).extra["rmia"]
    assert first["independent"]["local_trainings"] == 1 and first["fine_tuned"]["training_s"] > 0
    again = audit_at(0, model=received).extra["rmia"]  # a second audit of the round (e.g. a DP retrain's)
    assert again["fine_tuned"]["training_s"] == again["independent"]["training_s"] == 0.0
    independent = store["rmia"]["independent"]["copies"]
    later = audit_at(3).extra["rmia"]  # rounds 1 and 2 not audited: brought to 4 local trainings
    assert later["independent"]["local_trainings"] == 4 and later["independent"]["training_s"] > 0
    assert not torch.equal(store["rmia"]["independent"]["copies"].params["0.weight"], independent.params["0.weight"])
    # the same plan, seed and schedule give the same references and metrics
    store_before, store = store, {}
    audit_at(0)
    assert audit_at(3).metrics == audit_round(local, received, sets, audit, party="p", round_num=3, seed=5,
                                                 training=TRAINING, initial_model=initial,
                                                 store=store_before).metrics


@pytest.mark.slow
def test_the_initial_model_may_be_a_callable_called_only_when_the_independent_references_start():
    """audit_round takes the initial model or a zero-argument callable giving it (a caller that keeps it on disk):
    the same records, and the callable is called in the audit that starts the references, not in later ones (a
    second audit of the round, later rounds)."""
    sets, initial = task(), net(0)
    received = trained(initial, sets, epochs=3)
    local = trained(received, sets)
    audit = settings(references=["independent"], offline_a=0.3, reference_models=2)
    calls = []

    def source():
        calls.append(1)
        return copy.deepcopy(initial)

    lazy, eager = {}, {}
    for round_num, model in ((0, local), (0, received), (1, local), (3, local)):
        common = dict(party="p", round_num=round_num, seed=5, training=TRAINING)
        got = audit_round(model, received, sets, audit, initial_model=source, store=lazy, **common)
        want = audit_round(model, received, sets, audit, initial_model=initial, store=eager, **common)
        assert calls == [1] and got.metrics == want.metrics
        assert got.extra["rmia"]["independent"]["local_trainings"] == round_num + 1


def test_missing_inputs_are_named():
    sets, model = task(), net(0)
    with pytest.raises(ValueError, match="pass audit_round the party's LocalTraining"):
        audit_round(model, model, sets, settings(references=["fine_tuned"]), party="p", round_num=0)
    with pytest.raises(ValueError, match="initial_model="):
        audit_round(model, model, sets, settings(references=["independent"]), party="p", round_num=0,
                    training=TRAINING)


# ------------------------------------------------------------------------------------------ gated, reported


@pytest.mark.slow
def test_rmia_metrics_are_declared_gated_on_and_reported_with_private_scores(tmp_path):
    sets, initial = task(), net(0)
    local = trained(initial, sets)
    audit = settings(references=["global", "independent"])
    record = audit_round(local, initial, sets, audit, party="p", round_num=0, seed=1, training=TRAINING,
                         initial_model=initial)
    assert set(record.metrics) == set(audit_metric_names(audit))
    leak = record.metrics["rmia_independent_exact_auc"]
    assert leak > 0.6  # 30 epochs on 60 samples: the references tell the members apart

    gate = GatePolicy.from_mapping({"action": "withhold", "bound": "point",
                                    "thresholds": {"rmia_independent_exact_auc": leak - 0.01}}, audit_settings=audit)
    outcome = run_gate(gate, {"w": np.zeros(2)}, audited=True, audit_trained=lambda: record,
                       audit_received=lambda: record, empty_record=dict, retrain=None, audit_retrained=None)
    assert outcome.verdict == WITHHELD and "rmia_independent_exact_auc" in outcome.gate_verdict.tripped

    round_dir = ReportWriter(tmp_path, "p").write_round(record.to_json())
    for write in record.private:
        write(round_dir)
    page = (tmp_path / "p" / "index.html").read_text()
    assert "<td>rmia / independent</td>" in page and "<td>rmia / global</td>" in page
    row = next(csv.DictReader((tmp_path / "p" / "metrics.csv").open()))
    assert float(row["rmia_independent_exact_auc_lower"]) == record.metrics["rmia_independent_exact_auc_lower"]
    scores = np.load(round_dir / "rmia_scores.npz")
    assert scores["independent_members"].shape == (60,) and scores["global_population"].shape == (200,)
    stored = json.loads((round_dir / "audit.json").read_text())
    assert stored["extra"]["rmia"]["independent"]["reference_models"] == 1  # the default K
    # no per-sample array in the record that leaves the party's folder: the grid curves have Privacy Meter's 100 points
    lengths = {len(v) for res in stored["attacks"]["rmia"].values() for v in res.values() if isinstance(v, list)}
    assert lengths <= {100, 2}
