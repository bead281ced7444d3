"""Feedback on long work: the parties' phases read from the status events they write, the status line and its
ETA, progress bars only on a terminal, the audit-cost note, the "auditing ..." line and the end-of-run summary."""

import contextlib
import copy
import functools
import io
import json
import logging
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from audit.config.audit_settings import AuditSettings
from audit.membership.uncertainty import tpr_at_population_fpr
from audit.round_audit import AuditSets, audit_round
from audit.audit_cost import COST_FACTOR, MIN_AUDIT_S, STEP_ADVICE, audit_cost_note
from audit.round_record import AttackKey, RoundRecord
from report_drawing import no_report_drawing
from workspace.demo_output import Progress, print_summary
from src.process.party_events import ENV as PARTY_STATUS_ENV, emit
from workspace.party_status import PartyStatus, StatusFollower
from workspace.progress import ProgressLine, eta_seconds
from workspace.run_summary import summary_lines, tpr_reading



class Terminal(io.StringIO):
    def isatty(self):
        return True


# ------------------------------------------------------------------------------------------ phases from status events
def write_events(path: Path, monkeypatch, events: list[tuple]) -> None:
    """Each (party, phase, round, fields) written as the parties write them (src.process.party_events.emit)."""
    monkeypatch.setenv(PARTY_STATUS_ENV, str(path))
    for party, phase, round_num, fields in events:
        emit(party, phase, round_num, **fields)


def collaborator_round(name: str, r: int) -> list[tuple]:
    return [(name, phase, r, {}) for phase in ("validating", "training", "auditing", "auditing", "validating",
                                               "waiting")]


def followed(path: Path, party: str | None = None) -> list[tuple]:
    """(phase, round, reported) at each change, the file's events read one line at a time as it grows."""
    grown = path.with_name(f"{path.stem}.{party or 'all'}.grown")
    grown.unlink(missing_ok=True)
    follower, seen = StatusFollower(grown, party), []
    for line in path.read_bytes().splitlines(keepends=True):
        with open(grown, "ab") as out:
            out.write(line)
        if follower.poll():
            seen.append((follower.status.phase, follower.status.round, follower.status.reported))
    return seen


def test_a_collaborators_phases_from_its_events(tmp_path, monkeypatch):
    """Every round validate, train, audit (a re-audit changes nothing shown), validate, wait, then done; another
    party's events in the same file (one process) and events without a round keep what they do not say."""
    path = tmp_path / "status.jsonl"
    events = [("collaborator1", "waiting", None, {})]
    for r in (0, 1):
        events += collaborator_round("collaborator1", r) + collaborator_round("collaborator2", r)
    write_events(path, monkeypatch, events + [("collaborator1", "done", None, {})])
    seen = [(phase, r) for phase, r, _ in followed(path, "collaborator1")]
    expected = [(p, r) for r in (0, 1) for p in ("validating", "training", "auditing", "validating", "waiting")]
    assert seen == [("waiting", None)] + expected + [("done", 1)]
    assert PartyStatus("done", 1).text() == "done" and PartyStatus("auditing", 1).text() == "auditing r1"


def test_the_aggregators_progress_from_its_events(tmp_path, monkeypatch):
    path = tmp_path / "aggregator.status.jsonl"
    events = [("aggregator", "serving", None, {})]
    for r in (0, 1):
        events += [("aggregator", "waiting for collaborators", r, {"reported": []}),
                   ("aggregator", "waiting for collaborators", r, {"reported": []}),  # tasks sent to the second
                   ("aggregator", "waiting for collaborators", r, {"reported": ["collaborator2"]}),
                   ("aggregator", "waiting for collaborators", r, {"reported": ["collaborator2", "collaborator1"]})]
    write_events(path, monkeypatch, events + [("aggregator", "done", 1, {})])
    seen = followed(path)
    assert seen[0] == ("serving", None, ())
    for r in (0, 1):
        reported = [rep for phase, rr, rep in seen if rr == r and phase == "waiting for collaborators"]
        assert reported == [(), ("collaborator2",), ("collaborator2", "collaborator1")]
    assert seen[-1][0] == "done"
    status = PartyStatus("waiting for collaborators", 1, reported=("collaborator2",))
    assert status.text(2) == "r1 1/2 in"


def test_the_follower_reads_only_whole_new_lines(tmp_path, monkeypatch):
    """The file grows while it is read: a half-written line waits for its end, nothing is read twice, a line that is
    not an event is passed over."""
    source = tmp_path / "events.jsonl"
    write_events(source, monkeypatch, [("c", "waiting", None, {})] + collaborator_round("c", 0) + [("c", "done", None, {})])
    lines = source.read_bytes().splitlines(keepends=True)
    lines.insert(2, b"not an event\n")
    path = tmp_path / "c.status.jsonl"
    follower = StatusFollower(path)
    assert not follower.poll()  # no file yet
    seen = []
    with open(path, "wb") as out:
        for line in lines:
            cut = len(line) // 2
            out.write(line[:cut])
            out.flush()
            assert not follower.poll()
            out.write(line[cut:])
            out.flush()
            if follower.poll():
                seen.append((follower.status.phase, follower.status.round))
    assert seen == [("waiting", None), ("validating", 0), ("training", 0), ("auditing", 0), ("validating", 0),
                    ("waiting", 0), ("done", 0)]


def test_the_audit_cost_note_is_read_off_a_collaborators_events(tmp_path, monkeypatch):
    record = RoundRecord("collaborator1", 0, timings={"audit_s": 9.0, "membership_s": 9.0, "train_s": 1.0})
    note = audit_cost_note(record)
    assert note is not None
    path = tmp_path / "c.status.jsonl"
    write_events(path, monkeypatch, [("collaborator1", None, None, {"note": note}),
                                     ("collaborator1", "validating", 1, {})])
    follower = StatusFollower(path)
    follower.poll()
    assert follower.take_notes() == [note] and follower.take_notes() == []


def test_a_party_without_a_status_file_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.delenv(PARTY_STATUS_ENV, raising=False)
    monkeypatch.chdir(tmp_path)
    emit("collaborator1", "training", 0)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv(PARTY_STATUS_ENV, str(tmp_path / "s.jsonl"))
    with pytest.raises(ValueError, match="unknown phase 'trainig'"):
        emit("collaborator1", "trainig", 0)


# ------------------------------------------------------------------------------------------ status line and ETA
def test_eta_is_the_mean_round_without_the_start_up_round_times_the_rounds_left():
    times = [12.0, 6.0, 8.0]
    assert eta_seconds([], 0, 5, 3.0) is None
    assert eta_seconds(times[:1], 1, 5, 0.0) == pytest.approx(4 * 12.0)
    assert eta_seconds(times, 3, 5, 2.0) == pytest.approx(2 * 7.0 - 2.0)
    # a round running over the mean: never less than the rounds after it
    assert eta_seconds(times, 3, 5, 30.0) == pytest.approx(7.0)
    assert eta_seconds(times, 3, 3, 0.0) is None


def test_off_a_terminal_the_status_prints_a_line_per_change_only():
    stream = io.StringIO()
    line = ProgressLine(stream)
    updates = [(0, {"c1": "training r0"}, None)] * 5 + [(0, {"c1": "auditing r0"}, None)] * 3
    updates += [(1, {"c1": "waiting r0"}, 30.0), (1, {"c1": "waiting r0"}, 29.0), (1, {"c1": "waiting r0"}, 28.0)]
    for done, states, eta in updates:
        line.update(done, 2, states, eta)
    line.finish()
    out = stream.getvalue().splitlines()
    assert len(out) == 3 and "\r" not in stream.getvalue()
    assert "c1: training r0" in out[0] and "c1: auditing r0" in out[1]
    assert out[2].endswith("c1: waiting r0  ETA 30s") and "rounds 1/2 [#.]" in out[2]


def test_on_a_terminal_the_status_is_rewritten_in_place_and_fits_the_width(monkeypatch):
    monkeypatch.setenv("COLUMNS", "60")
    stream = Terminal()
    line = ProgressLine(stream)
    for phase in ("training", "auditing", "waiting"):
        line.update(0, 3, {"collaborator1": f"{phase} r0", "collaborator2": f"{phase} r0"}, 95.0)
    line.message("note from collaborator1: the audit took ...")
    line.update(1, 3, {"collaborator1": "waiting r0"}, 95.0)
    line.finish()
    text = stream.getvalue()
    drawn = [part for part in text.split("\r\033[K") if part]
    assert drawn[-1].endswith("\n") and text.count("\n") == 2  # the note's line and the last status line
    assert all(len(part.rstrip("\n")) < 60 for part in drawn if not part.startswith("note"))
    assert drawn[0].endswith("…")  # cut to the width: a wrapped line could not be rewritten in place
    monkeypatch.setenv("COLUMNS", "200")
    wide = Terminal()
    ProgressLine(wide).update(1, 3, {"collaborator1": "auditing r1"}, 95.0)
    assert wide.getvalue().startswith("\r\033[K[") and wide.getvalue().endswith("collaborator1: auditing r1  ETA 1m35s")


# ------------------------------------------------------------------------------------------ the demo's bars
def _walk_rounds(progress, rounds=3, collaborators=2):
    with progress:
        for r in range(rounds):
            for col in [f"collaborator{i + 1}" for i in range(collaborators)]:
                for phase in ("aggregated_model_validation", "train", "audit", "locally_tuned_model_validation"):
                    progress.phase(col, phase, r)
            progress.end_round()


def test_the_demos_bars_only_on_a_terminal():
    piped = io.StringIO()
    _walk_rounds(Progress(3, 2, 1, stream=piped))
    lines = piped.getvalue().splitlines()
    assert "\r" not in piped.getvalue() and "|" not in piped.getvalue()  # no tqdm bar, no redraws
    assert [re.sub(r" in .*", "", line) for line in lines] == ["round 0 done (1 of 3)", "round 1 done (2 of 3)",
                                                                "round 2 done (3 of 3)"]
    assert "ETA" in lines[0] and "ETA" not in lines[-1]
    terminal = Terminal()
    _walk_rounds(Progress(3, 2, 1, stream=terminal))
    assert "rounds:" in terminal.getvalue() and "\r" in terminal.getvalue() and "done in" not in terminal.getvalue()
    quiet = io.StringIO()
    _walk_rounds(Progress(3, 2, 1, enabled=False, stream=quiet))  # --no_progress
    assert quiet.getvalue() == ""


# ------------------------------------------------------------------------------------------ real audits
def tabular_sets(seed=0):
    """A synthetic tabular task (12 features, 4 classes) the suite's image tests do not use."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 12)) * 1.5

    def make(n):
        y = rng.integers(0, 4, size=n)
        return (centres[y] + rng.normal(size=(n, 12))).astype(np.float32), y

    return AuditSets(members=make(40), nonmembers=make(200), population=make(200))


def trained_pair(sets, epochs, seed=0):
    """(trained, received): a BatchNorm MLP trained `epochs` full-batch Adam steps from the received weights on the
    members, and the seconds it took."""
    import time

    torch.manual_seed(seed)
    received = nn.Sequential(nn.Linear(12, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 4))
    model = copy.deepcopy(received)
    x, y = sets.tensors("members")
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    start = time.perf_counter()
    model.train()
    for _ in range(epochs):
        optimiser.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimiser.step()
    model.eval()
    return model, received.eval(), time.perf_counter() - start


def test_the_cost_note_names_the_costliest_signal_of_a_real_audit():
    sets = tabular_sets()
    model, received, train_s = trained_pair(sets, epochs=2)
    settings = AuditSettings(signals=("loss", "gradient_norm"), fpr_tolerance=(0.05,),
                             sections={"rmia": {"enabled": False}})
    record = audit_round(model, received, sets, settings, party="p1", round_num=3, seed=0)
    record.timings["train_s"] = train_s
    timings = record.timings
    ratio = timings["audit_s"] / train_s
    note = audit_cost_note(record)
    assert (note is not None) == (ratio > COST_FACTOR and timings["audit_s"] >= MIN_AUDIT_S)
    assert audit_cost_note(record, factor=ratio * 1.01, min_audit_s=0) is None  # just below the audit's cost
    note = audit_cost_note(record, factor=ratio * 0.99, min_audit_s=0)
    assert note.startswith(f"p1 round 3: the audit took {timings['audit_s']:.2f} s, {ratio:.1f}x")
    assert "task_runner.settings" in note and "audit.interval" in note and "--auditing_interval" in note
    per_signal = {s: sum(m[s] for m in timings["signals_s"].values()) for s in ("loss", "gradient_norm")}
    costliest = max(per_signal, key=per_signal.get)
    assert (f"{costliest} is its costliest signal" in note) == (costliest == "gradient_norm")
    assert "audit.gradient_layer" in note if costliest == "gradient_norm" else f"{costliest} took" in note
    assert "most of it membership" in note  # the only step that ran


def test_the_summary_reads_the_strongest_tpr_and_its_interval_from_a_real_record(tmp_path):
    sets = tabular_sets(1)
    model, received, _ = trained_pair(sets, epochs=60, seed=1)
    settings = AuditSettings(signals=("loss", "logits"), fpr_tolerance=(0.05, 0.2), sections={"rmia": {"enabled": False}})
    record = RoundRecord.from_json(audit_round(model, received, sets, settings, party="p1", round_num=0,
                                               seed=0).to_json())  # as the summary reads it back
    lowest = 0.05
    metrics = record.metrics
    best = max(v for k, v in metrics.items() if k.endswith(f"_tpr_at_fpr_{lowest:g}"))
    reading = tpr_reading(record, lowest)
    assert reading.startswith(f"TPR at FPR 0.05 {best:.3f} [")
    model_kind, signal = re.search(r"\((\w+) (\w+)\)$", reading).groups()  # the attack named reaches the best TPR
    assert metrics[f"mia_{model_kind}_{signal}_tpr_at_fpr_0.05"] == best
    # The interval is the Clopper-Pearson interval at the attack's threshold rule, computed here on its own.
    with torch.no_grad():
        # float64 losses, as the audit's: in float32 the members' tiny losses round to 0 and tie with the threshold
        scores = {name: -nn.functional.cross_entropy(model(sets.tensors(name)[0]).double(), sets.tensors(name)[1],
                                                     reduction="none").numpy() for name in ("members", "nonmembers",
                                                                                            "population")}
    rates = tpr_at_population_fpr(scores["members"], scores["nonmembers"], scores["population"], lowest)
    loss = record.attack("local", "loss")
    only_loss = RoundRecord("p1", 0, attacks={AttackKey("local", "loss"): loss})
    band = f"[{rates.tpr.lower:.3f}, {rates.tpr.upper:.3f}]"
    assert tpr_reading(only_loss, lowest) == f"TPR at FPR 0.05 {loss['tpr_at_fpr']['0.05']:.3f} {band} (local loss)"
    del loss["uncertainty"]  # an attack without intervals: the point value alone
    assert tpr_reading(only_loss, lowest) == f"TPR at FPR 0.05 {loss['tpr_at_fpr']['0.05']:.3f} (local loss)"
    assert rates.tpr.lower < rates.tpr.upper


# ------------------------------------------------------------------------------------------ a real federation
@pytest.fixture(scope="module")
def audited_federation(tmp_path_factory):
    """Digits in process, 2 rounds, gradient_norm (the costly signal), Fidel on, OpenFL's own tqdm asked for in every
    task, a gate that withholds collaborator2's updates only; the task runner's log and stderr captured."""
    from workspace.in_process import run_in_process

    overrides = {
        "tasks": {"train": {"kwargs": {"epochs": 1, "use_tqdm": True}},
                  "aggregated_model_validation": {"kwargs": {"use_tqdm": True}},
                  "locally_tuned_model_validation": {"kwargs": {"use_tqdm": True}}},
        "task_runner": {"settings": {"audit": {"signals": ["loss", "gradient_norm"], "fpr_tolerance": [0.05, 0.2],
                                               "fidel": {"enabled": True}},
                                     "per_collaborator": {"collaborator2": {"gate": {
                                         "action": "withhold", "bound": "point", "thresholds": {"mia_local_loss_auc": 0.0}}}}}},
    }
    handler = logging.Handler()
    handler.records = []
    handler.emit = handler.records.append
    logger = logging.getLogger("audit.party_audit")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    stderr = io.StringIO()
    try:
        # The received model's signals are computed while it is validated (not in audit_s), so a digits audit can stay
        # under MIN_AUDIT_S on a fast machine: the note's one-second floor is lifted here, the ratio rule is not.
        # The status events, log lines, stderr and records are read, not the reports' pages.
        with contextlib.redirect_stderr(stderr), pytest.MonkeyPatch.context() as patch, no_report_drawing():
            patch.setattr("audit.party_audit.audit_cost_note", functools.partial(audit_cost_note, min_audit_s=0.0))
            run_dir = tmp_path_factory.mktemp("feedback")
            patch.setenv(PARTY_STATUS_ENV, str(run_dir / "status.jsonl"))  # every party of the process writes there
            result = run_in_process(run_dir, collaborators=2, rounds=2, overrides=overrides)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return result, [r.getMessage() for r in handler.records if r.levelno >= logging.INFO], stderr.getvalue()


@pytest.mark.federation
def test_the_parties_write_their_phases_as_status_events(audited_federation):
    """The events the task runner, its audit, the collaborator and the aggregator wrote during a real run (in one
    process, into one file): each collaborator's phases in order every round (collaborator2's gate withholds: its
    re-audit of the received model shows as the same phase), the aggregator's parties in, and the cost note once."""
    result, _, _ = audited_federation
    path = result.report_dir.parent / "status.jsonl"
    for name in ("collaborator1", "collaborator2"):
        seen = [(phase, r) for phase, r, _ in followed(path, name)]
        expected = [(p, r) for r in (0, 1) for p in ("validating", "training", "auditing", "validating", "waiting")]
        # then the final model's round (2): received and audited, no training
        final = [("validating", 2), ("auditing", 2), ("waiting", 2), ("done", 2)]
        assert seen == [("waiting", None)] + expected + final, f"{name}: {seen}"
        follower = StatusFollower(path, name)
        follower.poll()
        notes = follower.take_notes()
        assert len(notes) == 1 and notes[0].startswith(f"{name} round 0: the audit took")
    seen = followed(path, "aggregator")
    for r in (0, 1):
        reported = [set(rep) for phase, rr, rep in seen if rr == r and phase == "waiting for collaborators"]
        assert reported[0] == set() and reported[-1] == {"collaborator1", "collaborator2"}
    assert seen[-1] == ("done", 2, seen[-2][2])  # after the final model's round


@pytest.mark.federation
def test_each_audit_says_it_starts_and_a_costly_audit_is_noted_once_per_party(audited_federation):
    result, messages, _ = audited_federation
    for name in ("collaborator1", "collaborator2"):
        records = [RoundRecord.read(result.report_dir / name / f"round_{r:04d}" / "audit.json") for r in (0, 1)]
        starts = [m for m in messages if m.startswith(f"{name} round ") and ": auditing the trained model " in m]
        assert [m.split(":")[0] for m in starts] == [f"{name} round 0", f"{name} round 1"]
        members = records[0].sizes["members"]
        assert all(f"(signals loss, gradient_norm; {members} members, " in m for m in starts)
        costly = [r for r in records if r.timings["audit_s"] > COST_FACTOR * r.timings["train_s"]]
        assert costly  # gradient_norm, RMIA's references and Fidel vs one epoch on 90 samples: several times it
        notes = [m for m in messages if m.startswith(f"{name} round ") and "the audit took" in m]
        assert len(notes) == 1, notes  # once per party, at its first costly round
        assert notes[0] == audit_cost_note(costly[0], min_audit_s=0.0)
        timings = costly[0].timings
        # every step the record timed (the received-model check before training too: on a cold start its round 0
        # can cost most), not the totals
        steps = {k: v for k, v in timings.items() if k.endswith("_s") and isinstance(v, (int, float))
                 and k not in ("audit_s", "train_s", "audit_in_validation_s")}
        # the received model's signals, computed while it was validated, are the membership step's too
        steps["membership_s"] = steps.get("membership_s", 0.0) + timings.get("audit_in_validation_s", 0.0)
        assert "audit_in_validation" not in notes[0]
        costliest = max(steps, key=steps.get)
        if costliest == "fidel_s":  # its own switch is named, not the decoder this plan leaves off
            assert "most of it fidel" in notes[0] and "--fidel false" in notes[0] and "decoder" not in notes[0]
        elif costliest == "rmia_s":
            assert "most of it rmia" in notes[0] and "audit.rmia.reference_models" in notes[0]
        elif costliest == "membership_s":
            assert "most of it membership" in notes[0] and "gradient_norm" in notes[0]
        else:  # another step (the received-model check): its own advice, or its settings section
            step = costliest[:-2]
            assert f"most of it {step} (" in notes[0]
            assert STEP_ADVICE.get(step, f"the audit.{step} settings") in notes[0]


@pytest.mark.federation
def test_openfl_task_bars_are_not_drawn_off_a_terminal(audited_federation):
    _, _, stderr = audited_federation
    assert "train epoch" not in stderr and "validate:" not in stderr and "it/s" not in stderr


@pytest.mark.federation
def test_the_summary_of_a_real_run(audited_federation, capsys):
    result, _, _ = audited_federation
    names = ("collaborator1", "collaborator2")
    lines = summary_lines({n: result.report_dir / n for n in names}, result.aggregator_report_dir, 2)
    text = "\n".join(lines)
    assert "gate_tripped" not in text
    assert "gate: collaborator2: withhold if mia_local_loss_auc > 0 (collaborator1: none)" in text
    for r in (0, 1):
        verdicts = next(line for line in lines if line.startswith(f"round {r}: "))
        assert verdicts.startswith(f"round {r}: collaborator1 kept; collaborator2 withheld (mia_local_loss_auc ")
        assert verdicts.endswith("| averaged: collaborator1")
        for name in names:
            record = json.loads((result.report_dir / name / f"round_{r:04d}" / "audit.json").read_text())
            start = lines.index(verdicts)
            # a withheld update's verdict says whose it is: the trained update's, which was not sent
            whose = f"  {name}: " if name == "collaborator1" else f"  {name} (the trained update, not sent): "
            at = next(i for i in range(start, len(lines)) if lines[i].startswith(whose))
            # its leak verdict, read off its record, then the epsilon it proves and the other audits' figures
            said = "leak detected (" if record["leak"]["detected"] else "no leak detected ("
            assert lines[at].startswith(f"{whose}{said}{record['leak']['tests']} tests, Holm-corrected, 95%)")
            head = record["leak"]["headline"]
            assert f"{head['attack']} " in lines[at] and f"p = {head['p_adjusted']:.2g}" in lines[at]
            detail = lines[at + 1]
            assert detail.startswith(f"    ε ≥ {record['leak']['epsilon']['value']:.3g} at δ = 1e-05")
            assert f"Fidel revealed {record['metrics']['fidel_revealed_fraction']:.2f}" in detail
    # the demo's closing lines never list the gate's tripped values
    print_summary(result)
    out = capsys.readouterr().out
    assert "Average training loss = " in out and "gate_tripped" not in out


def test_the_summary_reads_the_lowest_tolerance_every_population_resolves():
    """The demo's 0.001 on 404 population samples is a reading at population FPR 0: the summary moves to the lowest
    tolerance every party resolves, and to the lowest of all only when none is resolved everywhere."""
    from audit.membership.population_attack import population_attack
    from workspace.run_summary import lowest_resolvable_tolerance

    rng = np.random.default_rng(3)

    def record(n_population, tolerances):
        result = population_attack(rng.normal(-1, 1, 90), rng.normal(0, 1, 90), rng.normal(0, 1, n_population),
                                   tolerances)
        return RoundRecord("p", 0, settings={"fpr_tolerance": list(tolerances)},
                           attacks={AttackKey("local", "loss"): result.to_dict()})

    assert lowest_resolvable_tolerance([record(404, (0.001, 0.01, 0.1))]) == 0.01
    assert lowest_resolvable_tolerance([record(404, (0.001, 0.01, 0.1)), record(50, (0.001, 0.01, 0.1))]) == 0.1
    assert lowest_resolvable_tolerance([record(5, (0.001, 0.01, 0.1))]) == 0.001  # none resolves: the lowest
    assert lowest_resolvable_tolerance([]) is None


def test_signals_computed_during_validation_count_as_the_membership_steps_cost():
    """The received model's signals are computed while it is validated (audit_in_validation_s): they are the
    membership step's cost, never a step of their own with made-up settings."""
    record = RoundRecord("p", 0, settings={"audit_global": True},
                         timings={"audit_s": 5.0, "train_s": 1.0, "membership_s": 1.0, "fidel_s": 1.5,
                                  "audit_in_validation_s": 2.5, "signals_s": {"global": {"gradient_norm": 2.5}}})
    note = audit_cost_note(record)
    assert "most of it membership (3.50 s)" in note and "audit_in_validation" not in note
    assert "gradient_norm is its costliest signal" in note
    record.timings["audit_in_validation_s"] = 0.2  # fidel (1.5 s) outweighs membership (1.2 s)
    assert "most of it fidel (1.50 s)" in audit_cost_note(record)


def test_the_self_audits_ceiling_is_n_over_the_harmonic_number():
    """n/H_n for the collaborator and its crowd: 2 users 4/3, 3 users 18/11 (docs/deanonymization.md)."""
    from audit.deanon.views import _ceiling

    assert _ceiling(RoundRecord("p", 0, extra={"deanon": {"crowd_users": 1}})) == ", at most 1.33 with 2 users"
    assert _ceiling(RoundRecord("p", 0, extra={"deanon": {"crowd_users": 2}})) == ", at most 1.64 with 3 users"
    assert _ceiling(RoundRecord("p", 0)) == ""
