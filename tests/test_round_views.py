"""A party's summaries read each round's view (audit.reporting.round_views), made once per record: every reading the
summaries make of a round gives the same value on the view's projected record as on the full record, the view keeps
none of the record's bulk, and a rewrite after a new round reads only what changed (so it costs the same in round 200
as in round 10)."""

from __future__ import annotations

import json

import pytest

from audit.config.audit_settings import AuditSettings
from audit.reporting import readings
from audit.reporting.headline import strongest_per_family
from audit.reporting.party import ReportWriter
from audit.reporting.round_views import forget_views, load_round_views, project
from audit.round_audit import audit_round
from audit.round_record import RoundRecord
from test_audit_steps import models, sets

TOLERANCES = [0.001, 0.05, 0.5]


def stored_record(round_num: int = 0) -> RoundRecord:
    settings = AuditSettings.from_mapping({"signals": ["loss", "logits"], "fpr_tolerance": TOLERANCES,
                                           "rmia": {"enabled": False}})
    local, received = models()
    record = audit_round(local, received, sets(), settings, party="p", round_num=round_num, seed=0)
    return RoundRecord.from_json(json.loads(json.dumps(record.to_json())))  # as audit.json holds it


@pytest.mark.slow  # a real audit round
def test_every_reading_of_the_summaries_is_the_same_on_the_projection():
    full = stored_record()
    small = project(full)
    assert full.attacks and set(small.attacks) == set(full.attacks)
    for key, result in full.attacks.items():
        projected = small.attacks[key]
        assert not {"fpr", "tpr", "thresholds"} & set(projected)  # the curves stay on disk
        for read in (readings.exact_auc_of, readings.auc_of, readings.exact_auc_band, readings.epsilon_lb_of,
                     readings.advantage_of):
            assert read(projected) == pytest.approx(read(result), nan_ok=True), (key, read.__name__)
        for t in TOLERANCES:
            for read in (readings.tpr_at, readings.tpr_band_at, readings.resolvable_at):
                assert read(projected, t) == pytest.approx(read(result, t), nan_ok=True), (key, t, read.__name__)
            assert readings.rates_at(projected, t)["tpr"] == readings.rates_at(result, t)["tpr"]
    for read in (readings.tolerances_of, readings.series_keys, readings.confidence_of):
        assert read([small]) == pytest.approx(read([full]), nan_ok=True) if read is readings.confidence_of else \
            read([small]) == read([full])
    for t in TOLERANCES:
        assert readings.unresolvable([small], t) == readings.unresolvable([full], t)
    assert strongest_per_family([small], readings.exact_auc_of) == strongest_per_family([full], readings.exact_auc_of)
    assert not small.metrics and small.leak is None  # the view holds its headline and verdict instead


@pytest.mark.slow  # real audit rounds and the party's pages
def test_a_rewrite_reads_only_the_records_that_changed(tmp_path, monkeypatch, saved_figures):
    writer = ReportWriter(tmp_path, "p")
    record = stored_record()
    for r in range(3):
        writer.store_round(RoundRecord.from_json({**record.to_json(), "round": r}))
    reads = []
    real = RoundRecord.from_json.__func__

    def counted(cls, data, source="round record"):
        reads.append(source)
        return real(cls, data, source)

    monkeypatch.setattr(RoundRecord, "from_json", classmethod(counted))
    writer.rebuild_summary()
    # each record for its view, and again for its section of the page (drawn once, then kept)
    assert sorted(s.split("/")[-2] for s in reads if s.endswith("audit.json")) == [
        "round_0000", "round_0000", "round_0001", "round_0001", "round_0002", "round_0002"]
    page_before = (tmp_path / "p" / "index.html").read_text()
    reads.clear()
    writer.store_round(RoundRecord.from_json({**record.to_json(), "round": 3}))
    reads.clear()
    writer.rebuild_summary()
    # the new round, and the sections of the new newest (open) and of the one before it (closed now)
    assert sorted(s.split("/")[-2] for s in reads if s.endswith("audit.json")) == ["round_0002", "round_0003",
                                                                                   "round_0003"]
    page = (tmp_path / "p" / "index.html").read_text()
    assert page.count('<details class="round"') == 4 and page_before.count('<details class="round"') == 3
    views = load_round_views(tmp_path / "p")
    assert [v.round for v in views] == [0, 1, 2, 3] and all(v.path is not None for v in views)
    # a record rewritten (a new file) is read again; one removed is forgotten
    (tmp_path / "p" / "round_0001" / "audit.json").unlink()
    assert [v.round for v in load_round_views(tmp_path / "p")] == [0, 2, 3]
    forget_views(tmp_path / "p")


@pytest.mark.slow
def test_the_page_from_views_is_the_page_from_records(tmp_path, saved_figures):
    """The page drawn by the writer (views made from the files, sections drawn from disk) and the page drawn from the
    full records in memory are the same page."""
    from audit.reporting.party_page import party_page

    writer = ReportWriter(tmp_path, "p")
    record = stored_record()
    records = [RoundRecord.from_json({**record.to_json(), "round": r}) for r in range(2)]
    for r in records:
        writer.store_round(r)
    views = load_round_views(tmp_path / "p")
    files = {v.round: set() for v in views}
    assert party_page("p", views, TOLERANCES, [], True, round_files=files) == \
        party_page("p", records, TOLERANCES, [], True, round_files=files)
    forget_views(tmp_path / "p")
