"""Typed from the settings to the page: a plan's FPR tolerances are parsed once (audit.config.tolerances), and the
round record carries them and the gate's entry typed (audit.record_parts) to every reader; a record read back from
its JSON is typed once, and a malformed typed part is refused naming its file and key."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from audit.config import tolerances
from audit.config.attack_key import AttackKey
from audit.config.audit_settings import AuditSettings
from audit.config.gate import GatePolicy, GateVerdict
from audit.config.tolerances import FprTolerances
from audit.gate_flow import GateOutcome
from audit.membership.population_attack import population_attack
from audit.record_parts import GateEntry, RecordSettings
from audit.reporting.headline import budget_of
from audit.reporting.readings import tolerances_of
from audit.round_record import RoundRecord

SETTINGS = {"signals": ["loss"], "fpr_tolerance": [0.5, 0.01, 0.1], "rmia": {"enabled": False}}


@pytest.fixture
def parses(monkeypatch):
    """Every tolerance list turned into FprTolerances from here on (a parse), counted."""
    made = []

    class Counted(FprTolerances):
        def __new__(cls, items):
            made.append(tuple(items))
            return super().__new__(cls, items)

    monkeypatch.setattr(tolerances, "FprTolerances", Counted)
    return made


def test_a_plans_tolerances_are_parsed_once_on_their_way_to_the_page(parses):
    settings = AuditSettings.from_mapping(SETTINGS)
    assert parses == [(0.5, 0.01, 0.1)]  # in the plan's order; checked again by __post_init__ without a parse
    GatePolicy.from_mapping({"thresholds": {"mia_local_loss_tpr_at_fpr_0.1": 0.5}, "bound": "point"},
                            audit_settings=settings)
    rng = np.random.default_rng(0)
    attack = population_attack(rng.normal(-1, 1, 40), rng.normal(0, 1, 40), rng.normal(0, 1, 40),
                               settings.fpr_tolerance)
    record = RoundRecord("p", 0, settings=RecordSettings.of(settings), attacks={AttackKey("local", "loss"): attack})
    assert record.settings.fpr_tolerance is settings.fpr_tolerance
    assert tolerances_of([record]) == [0.01, 0.1, 0.5]
    assert len(parses) == 1
    assert attack.tolerances == (0.5, 0.01, 0.1)
    population_attack([0.0, 1.0], [2.0, 3.0], [0.0, 3.0], [0.5])  # a caller's own list is parsed where it is given
    assert parses[1:] == [(0.5,)]


def test_a_record_read_back_is_typed_once_and_writes_the_same_json():
    settings = AuditSettings.from_mapping(SETTINGS)
    policy = GatePolicy.from_mapping({"action": "withhold", "epsilon_budget": 2.0}, audit_settings=settings)
    outcome = GateOutcome("withheld", GateVerdict(passed=False, tripped={"leak_epsilon_lb": (3.0, 2.0)}), None,
                          reason="over_threshold")
    record = RoundRecord("p", 1, settings=RecordSettings.of(settings), extra={"gate": outcome.record_entry(policy)})
    gate = record.gate
    assert isinstance(gate, GateEntry) and gate.has_budget and gate.decides and gate.epsilon_budget == 2.0
    assert (gate.verdict, gate.action, gate.reason, gate.retries) == ("withheld", "withhold", "over_threshold", 0)
    assert gate.thresholds == {"leak_epsilon_lb": 2.0} and budget_of(record) == 2.0
    text = json.dumps(record.to_json(), sort_keys=True)  # plain JSON: the typed parts are written as mappings
    again = RoundRecord.from_json(json.loads(text), "audit.json")
    assert json.dumps(again.to_json(), sort_keys=True) == text
    assert isinstance(again.settings.fpr_tolerance, FprTolerances)
    assert again.settings.fpr_tolerance == (0.5, 0.01, 0.1) and again.settings.confidence == settings.confidence
    assert again.gate.epsilon_budget == 2.0 and again.gate.tripped["leak_epsilon_lb"]["value"] == 3.0
    assert again.settings == settings.to_dict() and again == record


def test_a_gate_without_limits_or_entry_decides_nothing():
    settings = AuditSettings.from_mapping(SETTINGS)
    outcome = GateOutcome("kept", GateVerdict(passed=True), None)
    entry = outcome.record_entry(GatePolicy.from_mapping(None, audit_settings=settings))
    assert not entry.has_budget and not entry.decides and entry["epsilon_budget"] is None
    record = RoundRecord("p", 0)
    assert record.gate is None and math.isnan(budget_of(record))
    assert record.settings.fpr_tolerance == () and record.settings.confidence is None
    record.extra["gate"] = {"verdict": "kept", "thresholds": {"x_auc": 0.5}}  # a mapping put in: typed on first read
    assert record.gate.decides and not record.gate.has_budget and isinstance(record.extra["gate"], GateEntry)


@pytest.mark.parametrize("where, bad, key", [
    ("settings", {"fpr_tolerance": [0.1, 1.5]}, "record.settings.fpr_tolerance"),
    ("settings", {"confidence": "high"}, "record.settings.confidence"),
    ("gate", {"epsilon_budget": "one"}, "record.extra.gate.epsilon_budget"),
    ("gate", {"thresholds": [0.5]}, "record.extra.gate.thresholds"),
    ("gate", {"retries": -1}, "record.extra.gate.retries"),
    ("gate", {"verdict": 1}, "record.extra.gate.verdict"),
])
def test_a_malformed_typed_part_is_refused_naming_its_file_and_key(where, bad, key):
    data = RoundRecord("p", 0).to_json()
    if where == "settings":
        data["settings"] = bad
    else:
        data["extra"] = {"gate": bad}
    with pytest.raises(ValueError, match=rf"^round_0000/audit.json: {key}"):
        RoundRecord.from_json(data, "round_0000/audit.json")


def test_the_pages_settings_block_is_the_records_json():
    from audit.reporting.party_page import round_section

    settings = AuditSettings.from_mapping(SETTINGS)
    policy = GatePolicy.from_mapping({"action": "withhold", "epsilon_budget": 2.0}, audit_settings=settings)
    entry = GateOutcome("kept", GateVerdict(passed=True), None).record_entry(policy)
    record = RoundRecord.from_json(RoundRecord("p", 3, settings=RecordSettings.of(settings),
                                               extra={"gate": entry}).to_json())
    html = "\n".join(round_section(record, [0.1], set()))
    block = html[html.index("<pre>") + 5:html.index("</pre>")].replace("&quot;", '"')
    shown = json.loads(block)
    assert shown["settings"] == settings.to_dict() and shown["extra"]["gate"]["epsilon_budget"] == 2.0
