"""A real multi-process federation on this machine with mTLS (`python -m workspace`), intruders and faults.

One `prepare` (workspaces, CA, certificates: the slow part; tests/shared_runs.py) is shared: each federation below
starts from a fresh copy of it, as `start` requires. The main federation runs with two intruders knocking at the same time.
Every process is stopped by process group in the fixtures' finalizers, whatever happens.
"""

import ipaddress
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import yaml

from audit.run_record import RUN_FILE, RunRecord
from audit.run_states import FINISHED
from shared_runs import PREPARED_COLLABORATORS, PREPARED_ROUNDS, workspace_here
from workspace.processes import ParticipantLauncher, ProcessRegistry, fx_environment

ROOT = Path(__file__).resolve().parent.parent
FX = Path(sys.executable).parent / "fx"
pytestmark = [pytest.mark.skipif(not FX.exists(), reason="fx is installed with openfl in the project's venv"),
              pytest.mark.federation]

COLLABORATORS = PREPARED_COLLABORATORS
ROUNDS = PREPARED_ROUNDS
FEDERATION_TIMEOUT_S = 240


def start_cli(run_dir: Path, out: Path, *extra, tensorboard=False) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if tensorboard:  # every party's OpenFL MetricWriter also writes TensorBoard event files
        env["TENSORBOARD"] = "1"
    with open(out, "wb") as log:
        return subprocess.Popen([sys.executable, "-m", "workspace", "start", "--dir", str(run_dir),
                                 "--timeout", str(FEDERATION_TIMEOUT_S), *extra], cwd=ROOT, env=env,
                                stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def stop_group(popen: subprocess.Popen, sig=signal.SIGKILL) -> None:
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, sig)
        except ProcessLookupError:
            pass
    try:
        popen.wait(timeout=30)
    except subprocess.TimeoutExpired:
        pass


def wait_until(condition, timeout_s, what, tooling=None, log=None):
    """Wait for condition(); fail at once if the tooling exited meanwhile (its output tells why)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        if tooling is not None and tooling.poll() is not None:
            raise AssertionError(f"the tooling exited ({tooling.returncode}) while waiting for {what}:\n"
                                 + (log.read_text()[-3000:] if log else ""))
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def state(run_dir: Path) -> dict:
    try:
        return json.loads((run_dir / "federation.json").read_text())
    except (FileNotFoundError, ValueError):
        return {}


def all_pids(run_dir: Path) -> dict | None:
    """Every participant's pid once all have started (federation.json records each as it starts); else None."""
    current = state(run_dir)
    pids = current.get("extra", {}).get("pids") or {}
    return pids if pids and len(pids) == 1 + len(current.get("collaborators", ())) else None


def is_gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def fresh_copy(prepared: Path, dest: Path) -> Path:
    shutil.copytree(prepared, dest)
    return dest


@pytest.fixture(scope="module")
def prepared(prepared_federation):
    """The shared prepared federation (tests/shared_runs.py): 2 collaborators, 2 rounds of one epoch, mTLS."""
    return prepared_federation


# ---------------------------------------------------------------------------------------------------------
# intruders: a copy of a real collaborator's workspace with another identity


def make_intruders(run_dir: Path, dest: Path) -> dict:
    from openfl.cryptography.ca import generate_root_cert, sign_certificate
    from openfl.cryptography.io import read_crt, read_key, write_crt, write_key
    from openfl.cryptography.participant import generate_csr

    def workspace_copy(name):
        ws = dest / name
        shutil.copytree(run_dir / "collaborator1", ws, ignore=shutil.ignore_patterns("logs", "reports"))
        (ws / "logs").mkdir()
        return ws

    def issue(ws, common_name, issuer_key, issuer_name):
        key, csr = generate_csr(common_name, server=False)
        write_crt(sign_certificate(csr, issuer_key, issuer_name), ws / f"cert/client/col_{common_name}.crt")
        write_key(key, ws / f"cert/client/col_{common_name}.key")

    # Claims to be collaborator1, with a certificate from a CA the federation never trusted.
    foreign = workspace_copy("foreign_ca")
    rogue_key, rogue_cert = generate_root_cert()
    issue(foreign, "collaborator1", rogue_key, rogue_cert.subject)
    # A certificate signed by the federation's own CA, for a name that is not in plan/cols.yaml.
    unlisted = workspace_copy("unlisted")
    ca = run_dir / "aggregator" / "cert" / "ca"
    issue(unlisted, "intruder", read_key(ca / "signing-ca/private/signing-ca.key"), read_crt(ca / "signing-ca.crt").subject)
    with open(unlisted / "plan" / "data.yaml", "a") as f:
        f.write("intruder,1\n")
    return {"foreign_ca": (foreign, "collaborator1"), "unlisted": (unlisted, "intruder")}


def start_collaborator(registry, launcher, ws: Path, name: str):
    """`fx collaborator start -n NAME` in `ws`, forked by `launcher` as `python -m workspace start` forks each
    collaborator (its own session, folder and environment): the two intruders share one launcher's imports."""
    return registry.start(name, [str(FX), "collaborator", "start", "-n", name], cwd=ws,
                          log_path=ws / "logs" / "console.log", env=fx_environment("logs/intruder.log"),
                          launcher=launcher)


@dataclass
class Federation:
    run_dir: Path
    returncode: int
    output: str
    seconds: float
    listening: set
    port: int
    intruders: dict  # name -> (workspace, returncode when stopped: None = was still running)


@pytest.fixture(scope="module")
def federation(prepared, tmp_path_factory):
    base = tmp_path_factory.mktemp("federation")
    run_dir = fresh_copy(prepared, base / "run")
    intruders = make_intruders(run_dir, base / "intruders")
    registry = ProcessRegistry(stop_grace_s=0)  # the intruders are killed at the end, as stop_group does
    launcher = ParticipantLauncher(registry, cwd=base, log_path=base / "intruders_launcher.log")
    processes, knocking = {}, {}
    try:
        # The intruders first: they retry until the aggregator answers, so they knock during the whole run.
        for name, (ws, claimed) in intruders.items():
            knocking[name] = start_collaborator(registry, launcher, ws, claimed).popen
        # An fx collaborator takes several seconds to start; a short federation could be over before an intruder
        # knocks once. So wait until both are up and retrying against the not-yet-started aggregator.
        for name, (ws, _claimed) in intruders.items():
            log = ws / "logs" / "intruder.log"
            wait_until(lambda log=log: log.exists() and "Failed to send data request" in log.read_text(), 180,
                       f"intruder {name} to be retrying")
        started = time.monotonic()
        processes["tooling"] = tooling = start_cli(run_dir, base / "tooling.log", tensorboard=True)
        pids = wait_until(lambda: all_pids(run_dir), 60, "the participants' pids",
                          tooling, base / "tooling.log")
        # The collaborators start within a second of the aggregator and keep it busy from its first moment (a busy
        # aggregator can leave a request unanswered for seconds): they are held (SIGSTOP) until it has answered the
        # unlisted intruder, so that the intruder is refused while the federation runs, however fast it runs.
        held = [pids[name] for name in COLLABORATORS]
        for pid in held:
            os.killpg(pid, signal.SIGSTOP)
        try:
            unlisted = intruders["unlisted"][0] / "logs" / "intruder.log"
            wait_until(lambda: "StatusCode.UNAUTHENTICATED" in unlisted.read_text(), 120,
                       "the aggregator's answer to the unlisted intruder", tooling, base / "tooling.log")
        finally:
            for pid in held:
                os.killpg(pid, signal.SIGCONT)
        port = state(run_dir)["port"]
        aggregator = psutil.Process(pids["aggregator"])
        listening = wait_until(lambda: {c.laddr.ip for c in aggregator.net_connections(kind="tcp")
                                        if c.status == psutil.CONN_LISTEN and c.laddr.port == port}, 120,
                               "the aggregator's listening socket")
        tooling.wait(timeout=FEDERATION_TIMEOUT_S + 60)
        seconds = time.monotonic() - started
        intruder_codes = {name: knocking[name].poll() for name in intruders}
    finally:
        for popen in processes.values():
            stop_group(popen)
        registry.stop_all()
        launcher.close()
    print(f"federation: {seconds:.1f} s")
    return Federation(run_dir, tooling.returncode, (base / "tooling.log").read_text(), seconds, listening, port,
                      {name: (intruders[name][0], intruder_codes[name]) for name in intruders})


@pytest.mark.federation
def test_the_federation_finishes_and_says_where_the_reports_are(federation):
    assert federation.returncode == 0, federation.output[-4000:]
    assert f"federation finished: {ROUNDS}/{ROUNDS} rounds" in federation.output
    for name in ["aggregator", *COLLABORATORS]:
        assert str(federation.run_dir / name / "reports") in federation.output
    assert state(federation.run_dir)["status"] == "finished"


@pytest.mark.federation
def test_the_tool_shows_each_partys_phase_an_eta_and_a_summary_without_bars(federation):
    """The tooling's stdout is a file here: a status line per change (phases read from the parties' status events, an ETA
    once a round is done), no tqdm bar anywhere, and the summary of the records on disk."""
    from workspace.party_status import StatusFollower, status_file
    from workspace.run_summary import summary_lines

    assert federation.returncode == 0, federation.output[-4000:]
    status = [line for line in federation.output.splitlines() if line.startswith("[") and "rounds " in line]
    assert len(status) == len(set(status)), "a status line repeated: printed without a change"
    # The line shows each party's phase at each poll: a phase shorter than a poll may not show (one epoch on 90
    # samples; waiting, now that the report is drawn in the background), so the line must show every collaborator in
    # some phase of a round, and the audit (the longest phase) for at least one; the order of every phase is checked
    # from their status events below.
    phases = ("validating", "training", "auditing", "waiting")
    for name in COLLABORATORS:
        assert any(f"{name}: {phase} r" in line for line in status for phase in phases), name
    assert any(f"{name}: auditing r" in line for line in status for name in COLLABORATORS)
    assert any("ETA " in line for line in status)
    assert not any("ETA " in line for line in status if line.split("rounds ")[1].startswith("0/"))
    # Every participant's console output (stderr included): no progress bar drawn into a file.
    for name in ["aggregator", *COLLABORATORS]:
        console = (federation.run_dir / name / "logs" / f"{name}.console.log").read_text()
        assert "\r" not in console and "it/s]" not in console, name
    # The status events each collaborator wrote give its phases in order, every round.
    for name in COLLABORATORS:
        events = status_file(federation.run_dir / name, name).read_bytes().splitlines(keepends=True)
        grown = federation.run_dir / f"{name}.grown.jsonl"
        follower, seen = StatusFollower(grown), []
        for line in events:  # read as the tool reads it, while it grows
            with open(grown, "ab") as out:
                out.write(line)
            if follower.poll():
                seen.append((follower.status.phase, follower.status.round))
        expected = [("waiting", None)]  # it asks for tasks before round 0
        for r in range(ROUNDS):
            expected += [("validating", r), ("training", r), ("auditing", r), ("validating", r), ("waiting", r)]
        # the round after the last: the final model's accuracy and audit
        expected += [("validating", ROUNDS), ("auditing", ROUNDS), ("waiting", ROUNDS)]
        assert [s for s in seen if s[0] != "done"] == expected and seen[-1][0] == "done", seen
    expected_summary = summary_lines({n: federation.run_dir / n / "reports" / n for n in COLLABORATORS},
                                     federation.run_dir / "aggregator" / "reports" / "aggregator", ROUNDS)
    assert "\n".join(expected_summary[1:]) in federation.output


@pytest.mark.federation
def test_every_collaborator_audits_the_final_model_and_the_run_json_says_so(federation):
    """`python -m workspace run`: after the last round each collaborator audits the final model in its own process;
    the run folder's run.json (and each participant's report root's) holds every party's verdict, and the tool prints
    it."""
    assert federation.returncode == 0, federation.output[-4000:]
    roots = [federation.run_dir, *(federation.run_dir / name / "reports" for name in ["aggregator", *COLLABORATORS])]
    for root in roots:
        run = RunRecord.read(root / RUN_FILE)
        assert run.state == FINISHED and run.rounds == ROUNDS and set(run.parties) == set(COLLABORATORS), root
        for name in COLLABORATORS:
            final = run.parties[name].final_model
            assert final.audited and final.round == ROUNDS and final.leak is not None, (root, name)
            assert set(final.attacks) == {"final / loss", "final / logits"}  # RMIA is off in this plan
    for name in COLLABORATORS:
        assert (federation.run_dir / name / "reports" / name / "final_model" / "audit.json").is_file()
        assert f"  {RunRecord.read(federation.run_dir / RUN_FILE).parties[name].line()}" in federation.output


@pytest.mark.federation
def test_each_collaborator_reports_every_round_in_its_own_workspace(federation):
    for name in COLLABORATORS:
        party = federation.run_dir / name / "reports" / name
        for round_num in range(ROUNDS):
            record = json.loads((party / f"round_{round_num:04d}" / "audit.json").read_text())
            assert record["party"] == name and record["round"] == round_num
            assert set(record["attacks"]["local"]) == {"loss", "logits"}
        assert (party / "index.html").stat().st_size > 0
        others = set(COLLABORATORS) - {name}
        assert not any((federation.run_dir / name / "reports" / other).exists() for other in others)


@pytest.mark.federation
def test_the_aggregator_reports_every_round_with_scalars_only(federation):
    agg = federation.run_dir / "aggregator"
    report = agg / "reports" / "aggregator"
    for round_num in range(ROUNDS):
        record = json.loads((report / f"round_{round_num:04d}.json").read_text())
        assert record["authorized_collaborators"] == COLLABORATORS
        assert record["kept"] == COLLABORATORS and record["stragglers"] == []
        for entry in record["collaborators"].values():
            assert entry["audit_metrics"]["mia_local_loss_auc"] is not None
            assert all(v is None or isinstance(v, float) for v in entry["audit_metrics"].values())
        assert record["averaged_audit_metrics"]["mia_local_loss_auc"]["n"] == len(COLLABORATORS)
    assert (report / "decisions.csv").read_text().count("\n") == 1 + ROUNDS * len(COLLABORATORS)
    # Private data stays with the collaborators: no per-sample audit record or ROC on the aggregator's side.
    assert not list(agg.rglob("audit.json")) and not list(agg.rglob("roc.png"))


@pytest.mark.federation
def test_the_aggregator_listens_on_loopback_only(federation):
    assert federation.listening, "no listening socket seen"
    for address in federation.listening:
        assert ipaddress.ip_address(address.removeprefix("::ffff:")).is_loopback, federation.listening
    assert not federation.listening & {"::", "0.0.0.0"}


@pytest.mark.federation
def test_mtls_was_on_and_only_the_certified_collaborators_are_authorised(federation):
    agg = federation.run_dir / "aggregator"
    plan = yaml.safe_load((agg / "plan" / "plan.yaml").read_text())
    assert plan["network"]["settings"]["use_tls"] is True
    assert plan["network"]["settings"]["agg_addr"] == "localhost"
    assert sorted(yaml.safe_load((agg / "plan" / "cols.yaml").read_text())["collaborators"]) == COLLABORATORS
    for name in ["aggregator", *COLLABORATORS]:
        log = (federation.run_dir / name / "logs" / f"{name}.console.log").read_text()
        assert "TLS disabled" not in log and "insecure channel" not in log


@pytest.mark.federation
def test_a_collaborator_with_a_certificate_from_another_ca_is_refused(federation):
    ws, returncode = federation.intruders["foreign_ca"]
    assert returncode is None  # still knocking when the federation had finished: it never got a quit signal
    log = (ws / "logs" / "intruder.log").read_text()
    assert "Failed to send data request" in log and "Received Tasks" not in log
    assert not (ws / "reports").exists()
    agg_console = (federation.run_dir / "aggregator" / "logs" / "aggregator.console.log").read_text()
    assert "Handshake failed" in agg_console  # the TLS handshake, before any request was read
    assert federation.returncode == 0


@pytest.mark.federation
def test_a_collaborator_not_in_cols_yaml_is_refused(federation):
    ws, returncode = federation.intruders["unlisted"]
    assert returncode is None
    log = (ws / "logs" / "intruder.log").read_text()
    assert "StatusCode.UNAUTHENTICATED" in log  # the aggregator answered, and said no
    assert "Received Tasks" not in log and not (ws / "reports").exists()
    report = (federation.run_dir / "aggregator" / "reports" / "aggregator" / "round_0000.json").read_text()
    assert "intruder" not in report
    # ... and the aggregator says so in its own log, with the name claimed and where the request came from
    agg_log = (federation.run_dir / "aggregator" / "logs" / "aggregator.log").read_text()
    assert "Refused a request from 'intruder' (certificate name 'intruder') at ipv" in agg_log


@pytest.mark.federation
def test_a_run_starts_fresh_and_only_once(federation):
    assert not list(federation.run_dir.rglob("tensor.db"))  # persist_checkpoint: false, fresh folders
    plan = yaml.safe_load((federation.run_dir / "aggregator" / "plan" / "plan.yaml").read_text())
    assert plan["aggregator"]["settings"]["persist_checkpoint"] is False
    again = workspace_here("start", "--dir", federation.run_dir)  # refused before any child process
    assert again.returncode == 2
    assert "already started" in again.stderr


@pytest.mark.federation
def test_a_killed_collaborator_fails_the_run_naming_it_and_keeps_earlier_reports(prepared, tmp_path):
    run_dir = fresh_copy(prepared, tmp_path / "run")
    tooling = start_cli(run_dir, tmp_path / "tooling.log")
    try:
        agg_report = run_dir / "aggregator" / "reports" / "aggregator"
        wait_until(lambda: (agg_report / "round_0000.json").exists(), 180, "round 0", tooling, tmp_path / "tooling.log")
        pids = state(run_dir)["extra"]["pids"]
        os.kill(pids["collaborator2"], signal.SIGKILL)
        tooling.wait(timeout=90)  # not hanging: it notices the death at once
    finally:
        stop_group(tooling)
    output = (tmp_path / "tooling.log").read_text()
    assert tooling.returncode == 1, output[-3000:]
    assert f"collaborator2 (pid {pids['collaborator2']}) killed by SIGKILL" in output
    assert "FAILED" in output
    assert all(is_gone(pid) for pid in pids.values()), pids
    # Round 0 stays readable everywhere.
    for name in COLLABORATORS:
        json.loads((run_dir / name / "reports" / name / "round_0000" / "audit.json").read_text())
    record = json.loads((agg_report / "round_0000.json").read_text())
    assert record["kept"] == COLLABORATORS
    assert state(run_dir)["status"] == "failed"


@pytest.mark.federation
def test_ctrl_c_stops_every_process_it_started(prepared, tmp_path):
    run_dir = fresh_copy(prepared, tmp_path / "run")
    tooling = start_cli(run_dir, tmp_path / "tooling.log")
    try:
        pids = wait_until(lambda: all_pids(run_dir), 60, "the participants' pids",
                          tooling, tmp_path / "tooling.log")
        wait_until(lambda: all(not is_gone(p) for p in pids.values()) and (
            run_dir / "aggregator" / "logs" / "aggregator.log").exists(), 30, "the participants running",
            tooling, tmp_path / "tooling.log")
        tooling.send_signal(signal.SIGINT)
        tooling.wait(timeout=60)
    finally:
        stop_group(tooling)
    output = (tmp_path / "tooling.log").read_text()
    assert tooling.returncode == 130, output[-3000:]
    said = re.search(r"interrupted \(SIGINT\) after (\d+) of 2 rounds; stopped 3 running process\(es\): "
                     r"aggregator, collaborator1, collaborator2\n", output)
    assert said, output[-3000:]
    assert all(is_gone(pid) for pid in pids.values()), pids
    assert state(run_dir)["status"] == "interrupted"  # how it ended (before: "failed")


@pytest.mark.federation
@pytest.mark.parametrize("setting, key", [
    ("aggregator.settings.poll_interval_s=0", "aggregator.settings.poll_interval_s"),
    ("aggregator.settings.report_dir=[a, b]", "aggregator.settings.report_dir"),
])
def test_bad_settings_fail_before_any_certificate_is_made(tmp_path, setting, key):
    run_dir = tmp_path / "run"
    result = workspace_here("prepare", "--dir", run_dir, "--set", setting)  # refused before any child process
    assert result.returncode == 2
    assert key in result.stderr
    assert not run_dir.exists()


@pytest.mark.federation
def test_tensorboard_event_files_hold_each_partys_metrics_as_the_one_process_run_writes_them(federation, tmp_path,
                                                                                            monkeypatch):
    """TENSORBOARD=1: every party's event files (src.process.metric_writer, in <party>/logs/<party>_tensorboard) hold
    its metrics file's metrics under tags named by metric (the same in every party's run), one step per round, same
    values, and a collaborator's bounds beside them; the one-process run (the demo's) of the same plan writes the
    same tags."""
    from event_files import read_events, read_metric_lines, same_float32
    from report_drawing import no_report_drawing
    from src.process.metric_writer import tensorboard_tag
    from workspace.in_process import run_in_process

    parties = ["aggregator", *COLLABORATORS]
    events = {}
    for party in parties:
        logs = federation.run_dir / party / "logs"
        lines = read_metric_lines(logs / f"{party}_metrics.txt")
        assert len(lines) == ROUNDS + 1  # the training rounds, then the final model's audit (its own tags)
        events[party] = read_events(logs / f"{party}_tensorboard")
        tags = {tensorboard_tag(key, party): key for line in lines for key in line if tensorboard_tag(key, party)}
        bounds = {t for t in events[party] if t.endswith(("_lower", "_upper"))}
        assert set(events[party]) == set(tags) | bounds and "privacy/mia_local_loss_auc" in events[party]
        assert bool(bounds) == (party != "aggregator")  # a party's own bounds; no mean of bounds
        assert any(tag.endswith("final_model_audit/final_model_leak_detected") for tag in tags)
        for tag, points in events[party].items():
            rounds = [r for r, line in enumerate(lines) if tags.get(tag) in line] if tag in tags else range(ROUNDS)
            assert [step for step, _ in points] == list(rounds), (party, tag)
            if tag in tags:
                assert all(same_float32(value, lines[step][tags[tag]]) for step, value in points), (party, tag)
    monkeypatch.setenv("TENSORBOARD", "1")
    with no_report_drawing():  # its event files are read, not its report's pages
        run_in_process(tmp_path / "one_process", collaborators=len(COLLABORATORS), rounds=ROUNDS,
                       plan_path=federation.run_dir / "aggregator" / "plan" / "plan.yaml")
    for party in parties:
        assert set(read_events(tmp_path / "one_process" / "logs" / f"{party}_tensorboard")) == set(events[party])
