"""Feedback on long work: the parties' phases read from their logs, the status line and its ETA, progress bars only on
a terminal, the audit-cost note, the "auditing ..." line and the end-of-run summary."""

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
from audit.round_audit import AuditSets, audit_round, record_to_json
from src.audit_cost import COST_FACTOR, MIN_AUDIT_S, audit_cost_note
from workspace.demo_output import Progress, print_summary
from workspace.party_status import LogFollower, PartyStatus, apply_aggregator_line, apply_collaborator_line
from workspace.progress import ProgressLine, eta_seconds
from workspace.run_summary import summary_lines, tpr_reading

LOGS = Path(__file__).parent / "data" / "openfl_logs"


class Terminal(io.StringIO):
    def isatty(self):
        return True


# ------------------------------------------------------------------------------------------ phases from real logs
def phases(path: Path, apply) -> list[tuple]:
    status, seen = PartyStatus(), []
    for line in path.read_text().splitlines():
        if apply(status, line):
            seen.append((status.phase, status.round, status.reported))
    return seen


def test_a_collaborators_phases_from_its_real_openfl_log():
    """A log `python -m workspace run` wrote (OpenFL 1.9, this task runner): every round validate, train, audit,
    validate, wait, in that order, then done; continuation lines (the task list) and unrelated lines change nothing."""
    seen = [(phase, r) for phase, r, _ in phases(LOGS / "collaborator1.log", apply_collaborator_line)]
    rounds = sorted({r for _, r in seen if r is not None})
    assert rounds == [0, 1]
    expected = [(p, r) for r in rounds for p in ("validating", "training", "auditing", "validating", "waiting")]
    assert seen == [("waiting", None)] + expected + [("done", 1)]  # it asks for tasks before round 0


def test_the_aggregators_progress_from_its_real_openfl_log():
    seen = phases(LOGS / "aggregator.log", apply_aggregator_line)
    assert seen[0] == ("serving", None, ())
    for r in (0, 1):
        reported = [rep for phase, rr, rep in seen if rr == r and phase == "waiting for collaborators"]
        assert reported[0] == () and len(reported[-1]) == 2  # from none in to both in
    assert seen[-1][0] == "done"
    status = PartyStatus("waiting for collaborators", 1, reported=("collaborator2",))
    assert status.text(2) == "r1 1/2 in"


def test_the_follower_reads_only_whole_new_lines(tmp_path):
    """The log grows while it is read: a half-written line waits for its end, nothing is read twice."""
    lines = (LOGS / "collaborator1.log").read_bytes().splitlines(keepends=True)
    log = tmp_path / "c.log"
    follower = LogFollower(log)
    assert not follower.poll()  # no file yet
    seen = []
    with open(log, "wb") as out:
        for line in lines:
            cut = len(line) // 2
            out.write(line[:cut])
            out.flush()
            follower.poll()
            out.write(line[cut:])
            out.flush()
            if follower.poll():
                seen.append((follower.status.phase, follower.status.round))
    status, whole = PartyStatus(), []
    for line in lines:
        if apply_collaborator_line(status, line.decode().rstrip("\n")):
            whole.append((status.phase, status.round))
    assert seen == whole and seen


def test_the_audit_cost_note_is_read_off_a_collaborators_log(tmp_path):
    record = {"party": "collaborator1", "round": 0, "timings": {"audit_s": 9.0, "membership_s": 9.0, "train_s": 1.0}}
    note = audit_cost_note(record)
    assert note is not None
    log = tmp_path / "c.log"
    log.write_text(f"[12:00:00] [taskrunner.py:240] WARNING {note}\n[12:00:01] [taskrunner.py:250] INFO x\n")
    follower = LogFollower(log)
    follower.poll()
    assert follower.take_notes() == [note] and follower.take_notes() == []


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
    assert [re.sub(r" in .*", "", line) for line in lines] == ["round 1/3 done", "round 2/3 done", "round 3/3 done"]
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
    record["timings"]["train_s"] = train_s
    timings = record["timings"]
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
    record = record_to_json(audit_round(model, received, sets, settings, party="p1", round_num=0, seed=0))
    lowest = 0.05
    metrics = record["metrics"]
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
    loss = record["attacks"]["local"]["loss"]
    only_loss = {"attacks": {"local": {"loss": loss}}}
    band = f"[{rates.tpr.lower:.3f}, {rates.tpr.upper:.3f}]"
    assert tpr_reading(only_loss, lowest) == f"TPR at FPR 0.05 {loss['tpr_at_fpr']['0.05']:.3f} {band} (local loss)"
    del loss["uncertainty"]  # a record written before the intervals: the point value alone
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
    logger = logging.getLogger("src.taskrunner")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    stderr = io.StringIO()
    try:
        # The received model's signals are computed while it is validated (not in audit_s), so a digits audit can stay
        # under MIN_AUDIT_S on a fast machine: the note's one-second floor is lifted here, the ratio rule is not.
        with contextlib.redirect_stderr(stderr), pytest.MonkeyPatch.context() as patch:
            patch.setattr("src.taskrunner.audit_cost_note", functools.partial(audit_cost_note, min_audit_s=0.0))
            result = run_in_process(tmp_path_factory.mktemp("feedback"), collaborators=2, rounds=2,
                                    overrides=overrides)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    return result, [r.getMessage() for r in handler.records if r.levelno >= logging.INFO], stderr.getvalue()


@pytest.mark.federation
def test_each_audit_says_it_starts_and_a_costly_audit_is_noted_once_per_party(audited_federation):
    result, messages, _ = audited_federation
    for name in ("collaborator1", "collaborator2"):
        records = [json.loads((result.report_dir / name / f"round_{r:04d}" / "audit.json").read_text())
                   for r in (0, 1)]
        starts = [m for m in messages if m.startswith(f"{name} round ") and ": auditing the trained model " in m]
        assert [m.split(":")[0] for m in starts] == [f"{name} round 0", f"{name} round 1"]
        members = records[0]["sizes"]["members"]
        assert all(f"(signals loss, gradient_norm; {members} members, " in m for m in starts)
        costly = [r for r in records if r["timings"]["audit_s"] > COST_FACTOR * r["timings"]["train_s"]]
        assert costly  # gradient_norm, RMIA's references and Fidel vs one epoch on 90 samples: several times it
        notes = [m for m in messages if m.startswith(f"{name} round ") and "the audit took" in m]
        assert len(notes) == 1, notes  # once per party, at its first costly round
        assert notes[0] == audit_cost_note(costly[0], min_audit_s=0.0)
        timings = costly[0]["timings"]
        steps = {k: v for k, v in timings.items() if k in ("membership_s", "fidel_s", "rmia_s")}
        # the received model's signals, computed while it was validated, are the membership step's too
        steps["membership_s"] = steps.get("membership_s", 0.0) + timings.get("audit_in_validation_s", 0.0)
        assert "audit_in_validation" not in notes[0]
        costliest = max(steps, key=steps.get)
        if costliest == "fidel_s":  # its own switch is named, not the decoder this plan leaves off
            assert "most of it fidel" in notes[0] and "--fidel false" in notes[0] and "decoder" not in notes[0]
        elif costliest == "rmia_s":
            assert "most of it rmia" in notes[0] and "audit.rmia.reference_models" in notes[0]
        else:
            assert "most of it membership" in notes[0] and "gradient_norm" in notes[0]


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
        assert verdicts.startswith(f"round {r}: collaborator1 kept; collaborator2 withheld (mia_local_loss_auc = ")
        assert verdicts.endswith("| averaged: collaborator1")
        for name in names:
            record = json.loads((result.report_dir / name / f"round_{r:04d}" / "audit.json").read_text())
            start = lines.index(verdicts)
            at = next(i for i in range(start, len(lines)) if lines[i].startswith(f"  {name}: "))
            # its leak verdict, read off its record, then the epsilon it proves and the other audits' figures
            said = "leak detected (" if record["leak"]["detected"] else "no leak detected ("
            assert lines[at].startswith(f"  {name}: {said}{record['leak']['tests']} tests, Holm-corrected, 95%)")
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
        return {"settings": {"fpr_tolerance": list(tolerances)}, "attacks": {"local": {"loss": result.to_dict()}}}

    assert lowest_resolvable_tolerance([record(404, (0.001, 0.01, 0.1))]) == 0.01
    assert lowest_resolvable_tolerance([record(404, (0.001, 0.01, 0.1)), record(50, (0.001, 0.01, 0.1))]) == 0.1
    assert lowest_resolvable_tolerance([record(5, (0.001, 0.01, 0.1))]) == 0.001  # none resolves: the lowest
    assert lowest_resolvable_tolerance([]) is None


def test_signals_computed_during_validation_count_as_the_membership_steps_cost():
    """The received model's signals are computed while it is validated (audit_in_validation_s): they are the
    membership step's cost, never a step of their own with made-up settings."""
    record = {"party": "p", "round": 0, "settings": {"audit_global": True},
              "timings": {"audit_s": 5.0, "train_s": 1.0, "membership_s": 1.0, "fidel_s": 1.5,
                          "audit_in_validation_s": 2.5, "signals_s": {"global": {"gradient_norm": 2.5}}}}
    note = audit_cost_note(record)
    assert "most of it membership (3.50 s)" in note and "audit_in_validation" not in note
    assert "gradient_norm is its costliest signal" in note
    record["timings"]["audit_in_validation_s"] = 0.2  # fidel (1.5 s) outweighs membership (1.2 s)
    assert "most of it fidel (1.50 s)" in audit_cost_note(record)


def test_the_self_audits_ceiling_is_n_over_the_harmonic_number():
    """n/H_n for the collaborator and its crowd: 2 users 4/3, 3 users 18/11 (docs/deanonymization.md)."""
    from audit.deanon.views import _ceiling

    assert _ceiling({"extra": {"deanon": {"crowd_users": 1}}}) == ", at most 1.33 with 2 users"
    assert _ceiling({"extra": {"deanon": {"crowd_users": 2}}}) == ", at most 1.64 with 3 users"
    assert _ceiling({"extra": {}}) == ""
