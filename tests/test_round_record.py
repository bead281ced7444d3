"""The typed round record: its JSON round-trip carries the schema version and never the private part, a record of
another schema is refused with one line naming its file (never read with NaN figures), and every metric name of an
attack is derived from its AttackKey."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from audit.config.audit_settings import AuditSettings
from audit.config.gate import audit_metric_names
from audit.config.vocabulary import RMIA, attack_statistics
from audit.membership.population_attack import population_attack
from audit.membership.attack_uncertainty import attack_metrics
from audit.membership.step import scalar_metrics
from audit.reporting.party import ReportWriter
from audit.reporting.records import load_round_records
from audit.round_audit import AuditSets, audit_round
from audit.round_record import SCHEMA_VERSION, AttackKey, RecordSchemaError, RoundRecord

TOLERANCES = (0.05, 0.2)


def _sets(seed=0, n=40):
    rng = np.random.default_rng(seed)

    def one(shift):
        x = rng.normal(shift, 1.0, (n, 5)).astype(np.float32)
        return x, (x[:, 0] > shift).astype(np.int64)

    return AuditSets(one(0.0), one(0.3), one(0.0))


def _audited_record() -> RoundRecord:
    torch.manual_seed(0)
    make = lambda: torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))  # noqa: E731
    settings = AuditSettings(signals=("loss", "logits"), fpr_tolerance=TOLERANCES,
                             sections={"rmia": {"enabled": False}})
    return audit_round(make(), make(), _sets(), settings, party="p1", round_num=2, seed=7)


@pytest.fixture(scope="module")
def audited() -> RoundRecord:
    return _audited_record()


def test_a_real_record_round_trips_through_its_json_with_the_schema_version(audited, tmp_path):
    data = audited.to_json()
    assert data["schema_version"] == SCHEMA_VERSION
    text = json.dumps(data, allow_nan=False)  # strict JSON, as audit.json holds it
    back = RoundRecord.from_json(json.loads(text))
    assert back.to_json() == json.loads(text)
    # The attacks keep their keys and their order; read back they are the results' JSON dicts.
    assert list(back.attacks) == list(audited.attacks)
    assert back.attacks == {key: result.to_dict() for key, result in audited.attacks.items()}
    assert (back.party, back.round, back.seed, back.metrics, back.leak) == ("p1", 2, 7, audited.metrics, audited.leak)
    # The written file is the same record.
    ReportWriter(tmp_path, "p1").store_round(audited)
    assert RoundRecord.read(tmp_path / "p1" / "round_0002" / "audit.json") == back


def test_the_private_part_never_leaves_memory(audited, tmp_path):
    assert audited.private  # the membership step's per-sample signals writer
    assert not any("private" in key for key in audited.to_json())
    round_dir = ReportWriter(tmp_path, "p1").store_round(audited)
    assert (round_dir / "signals.npz").is_file()  # written by the private part, into the party's own folder ...
    stored = (round_dir / "audit.json").read_text()
    assert "signals.npz" not in stored and "private" not in stored  # ... and never part of what the record says
    assert RoundRecord.read(round_dir / "audit.json").private == ()


@pytest.mark.parametrize("version", [None, 0, SCHEMA_VERSION + 1])
def test_a_record_of_another_schema_is_refused_naming_its_file_and_both_versions(audited, tmp_path, caplog, version):
    writer = ReportWriter(tmp_path, "p1")
    writer.store_round(RoundRecord("p1", 0))
    round_dir = writer.store_round(audited)
    path = round_dir / "audit.json"
    data = json.loads(path.read_text())
    if version is None:
        del data["schema_version"]
    else:
        data["schema_version"] = version
    path.write_text(json.dumps(data))

    with pytest.raises(RecordSchemaError) as err:
        RoundRecord.read(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and f"schema version {SCHEMA_VERSION}" in message
    assert ("no schema version" in message) if version is None else (f"schema version {version}" in message)

    # The report's readers skip it with that one line: never a record read with its figures missing.
    with caplog.at_level(logging.WARNING, logger="audit.reporting.records"):
        assert [r.round for r in load_round_records(tmp_path / "p1")] == [0]
    (line,) = [r.getMessage() for r in caplog.records if str(path) in r.getMessage()]
    assert f"this code reads schema version {SCHEMA_VERSION}" in line
    # ... and the party's page says which record it left out, and why.
    writer.rebuild_summary()
    page = (tmp_path / "p1" / "index.html").read_text()
    assert f"Not shown: {path}: round record has " in page and "Round 0" in page and "Round 2" not in page


def test_a_field_the_record_does_not_have_is_named():
    data = RoundRecord("p1", 0).to_json()
    with pytest.raises(ValueError, match=r"audit\.json: record\.metric is not a field"):
        RoundRecord.from_json({**data, "metric": {}}, "audit.json")
    with pytest.raises(ValueError, match=r"audit\.json: record\.metrics is missing"):
        RoundRecord.from_json({k: v for k, v in data.items() if k != "metrics"}, "audit.json")


def test_metric_names_derive_from_the_attack_keys(audited):
    """Every attack's metrics in a real audit are AttackKey(model, signal).metric(statistic) for the statistics the
    vocabulary lists, and the plan's declared names are built the same way."""
    statistics = attack_statistics(TOLERANCES)
    derived = {key.metric(s) for key in audited.attacks for s in statistics}
    attack_metrics_found = {name for name in audited.metrics if name.startswith("mia_")}
    assert derived == attack_metrics_found
    assert {"mia_local_loss_exact_auc", "mia_update_loss_reduction_tpr_at_fpr_0.05_upper"} <= derived
    declared = audit_metric_names(AuditSettings(signals=("loss", "logits"), fpr_tolerance=TOLERANCES,
                                                sections={"rmia": {"enabled": False}}))
    assert derived <= set(declared)
    # RMIA's key names its attack rmia_<references>, its population population__rmia_<references>.
    key = AttackKey(RMIA, "independent")
    assert (key.metric("exact_auc"), key.name, key.population_metric) == (
        "rmia_independent_exact_auc", "rmia_independent", "population__rmia_independent")
    # A step's attacks, keyed or nested, give the same metric names.
    rng = np.random.default_rng(1)
    result = population_attack(rng.normal(1, 1, 60), rng.normal(0, 1, 60), rng.normal(0, 1, 60), TOLERANCES,
                               signal="loss")
    keyed = scalar_metrics({AttackKey("local", "loss"): result})
    assert keyed == scalar_metrics({"local": {"loss": result}})
    assert keyed == {AttackKey("local", "loss").metric(s): v for s, v in attack_metrics(result).items()}
