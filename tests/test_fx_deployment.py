"""The fx deployment path of docs/deployment.md ("A deployment over several hosts"), end to end, with OpenFL's own
commands only.

Marked federation: one federation of one round, run by hand with OpenFL's `fx` commands, and `python -m workspace
prepare` once (the prepared federation of tests/shared_runs.py, shared with the multi-process tests). Every party
works in its own fresh folder, as on separate hosts: the aggregator's folder is what a clone of this repository holds;
each collaborator's folder holds only what `fx workspace import` unpacked from the aggregator's export and the
certificate the aggregator's CA signed. Nothing is installed (all parties share this venv), and nothing but `fx`
touches the collaborator's folder, so `audit` can only come from the export."""

import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from audit.run_record import RUN_FILE, RunRecord
from audit.run_states import FINISHED
from shared_runs import PREPARED_COLLABORATORS, workspace_here
from workspace.plan_file import deep_merge
from workspace.run_plan import merge_overrides

ROOT = Path(__file__).resolve().parent.parent
FX = Path(sys.executable).parent / "fx"
pytestmark = [pytest.mark.skipif(not FX.exists(), reason="fx is installed with openfl in the project's venv"),
              pytest.mark.federation]

WORKSPACE_NAME = "fl_workspace"  # names the export (fl_workspace.zip) and the folder import unpacks it into
COLLABORATOR = "collaborator1"
# The smallest federation that still audits: digits, one collaborator, one round of one epoch, one signal.
TINY = ["aggregator.settings.rounds_to_train=1", "data_loader.settings.collaborator_count=1",
        "tasks.train.kwargs.epochs=1", "task_runner.settings.audit.signals=[loss]",
        "task_runner.settings.audit.fpr_tolerance=[0.1]", "task_runner.settings.audit.audit_global=false"]
FEDERATION_TIMEOUT_S = 240


def env():
    # No PYTHONPATH: each party must import its own folder's code (fx puts its working folder first on sys.path).
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONUNBUFFERED": "1"}


def clone_of_the_repository(dest: Path) -> Path:
    """What the aggregator's operator has after `git clone`: the workspace files, symlinks as links."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pbuf")
    for name in ("plan", "src", "audit", "workspace"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore, symlinks=True)
    for name in ("requirements.txt", ".workspace"):
        shutil.copy2(ROOT / name, dest / name)
    (dest / "save").mkdir()
    assert (dest / "src" / "shipped" / "audit").is_symlink()  # as git checks it out
    return dest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(popen: subprocess.Popen) -> None:
    if popen.poll() is None:
        try:
            os.killpg(popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    popen.wait(timeout=30)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_readme_fx_sequence_runs_a_federation_across_fresh_folders(tmp_path, fx_fork):
    """The set-up commands run through OpenFL's entry point in forks (tests/fx_forks.py: what the `fx` script calls,
    in the command's folder, importing that folder's code); the aggregator and the collaborator are real `fx`
    processes, each a new interpreter that imports its own folder's code."""

    def fx(cwd: Path, *args: str) -> str:
        result = fx_fork(cwd, *args)
        assert result.returncode == 0, f"fx {' '.join(args)} in {cwd}:\n{result.stdout[-3000:]}"
        return result.stdout

    agg_host, col_host = tmp_path / "aggregator_host", tmp_path / "collaborator_host"
    col_host.mkdir()
    agg = clone_of_the_repository(agg_host / WORKSPACE_NAME)

    # Aggregator host: the plan (a tiny one, on a free port of 127.0.0.1) and its initial model, the export.
    plan_path = agg / "plan" / "plan.yaml"
    plan = deep_merge(yaml.safe_load(plan_path.read_text()),
                      merge_overrides([*TINY, f"network.settings.agg_port={free_port()}"]))
    plan_path.write_text(yaml.safe_dump(plan, sort_keys=False))
    (agg / "plan" / "cols.yaml").write_text("collaborators: []\n")  # `fx collaborator certify` lists whom it signs
    fx(agg, "plan", "initialize", "-a", "localhost")
    fx(agg, "workspace", "export")
    archive = agg / f"{WORKSPACE_NAME}.zip"
    names = zipfile.ZipFile(archive).namelist()
    assert "src/shipped/audit/round_audit.py" in names and not any(n.startswith("audit/") for n in names)

    def aggregator_host():  # the CA and the server certificate (the export holds none of it)
        fx(agg, "workspace", "certify")
        subprocess.run("chmod 600 cert/ca/*/private/*.key", shell=True, cwd=agg, check=True)  # docs/deployment.md's step
        fx(agg, "aggregator", "generate-cert-request", "--fqdn", "localhost")
        fx(agg, "aggregator", "certify", "--fqdn", "localhost", "--silent")

    def collaborator_host():  # the archive arrives, is imported; the collaborator registers its shard, asks for a cert
        shutil.copy2(archive, col_host / archive.name)
        fx(col_host, "workspace", "import", "--archive", archive.name)
        fx(col, "collaborator", "create", "-n", COLLABORATOR, "-d", "1", "--silent")
        fx(col, "collaborator", "generate-cert-request", "-n", COLLABORATOR, "--silent")

    col = col_host / WORKSPACE_NAME
    with ThreadPoolExecutor(2) as hosts:  # two hosts, working at the same time
        for job in [hosts.submit(aggregator_host), hosts.submit(collaborator_host)]:
            job.result()
    assert all(mode(key) == 0o600 for key in (agg / "cert").rglob("*.key"))
    assert not (col / "audit").exists()  # only what OpenFL's export packs
    assert (col / "src" / "shipped" / "audit").is_dir() and not (col / "src" / "shipped" / "audit").is_symlink()

    # The request travels to the aggregator, the signed certificate back.
    request = f"col_{COLLABORATOR}_to_agg_cert_request.zip"
    shutil.move(col / request, agg / request)
    fx(agg, "collaborator", "certify", "--request-pkg", request, "--silent")
    signed = f"agg_to_col_{COLLABORATOR}_signed_cert.zip"
    shutil.move(agg / signed, col / signed)
    fx(col, "collaborator", "certify", "--import", signed)
    assert yaml.safe_load((agg / "plan" / "cols.yaml").read_text())["collaborators"] == [COLLABORATOR]

    # Both start, each in its own folder and process group; the run ends when the round is done.
    logs = {name: tmp_path / f"{name}.log" for name in ("aggregator", COLLABORATOR)}
    commands = {"aggregator": (agg, ["aggregator", "start"]),
                COLLABORATOR: (col, ["collaborator", "start", "-n", COLLABORATOR])}
    processes = {}
    try:
        for name, (cwd, args) in commands.items():
            with open(logs[name], "wb") as log:
                processes[name] = subprocess.Popen([str(FX), *args], cwd=cwd, env=env(), stdout=log,
                                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                   start_new_session=True)
        deadline = time.monotonic() + FEDERATION_TIMEOUT_S
        while time.monotonic() < deadline and any(p.poll() is None for p in processes.values()):
            if any(p.poll() not in (None, 0) for p in processes.values()):
                break
            time.sleep(0.5)
    finally:
        for popen in processes.values():
            stop_group(popen)
    outputs = {name: log.read_text(errors="replace")[-4000:] for name, log in logs.items()}
    assert all(p.returncode == 0 for p in processes.values()), outputs

    # The collaborator audited its update in its own folder; only scalars reached the aggregator.
    report = col / "reports" / COLLABORATOR / "round_0000" / "audit.json"
    assert report.is_file(), outputs[COLLABORATOR]
    assert "mia_local_loss_auc" in report.read_text()
    # RMIA ran in the collaborator's process too, its independent references from the plan's initial model (the
    # multi-process tests' federation runs without it)
    assert set(json.loads(report.read_text())["attacks"]["rmia"]) == {"global", "independent"}
    assert not list(agg.rglob("audit.json"))
    assert (agg / "reports" / "aggregator" / "round_0000.json").is_file()
    # After the last round the collaborator audited the final model in its own folder (the round after the last:
    # the aggregator's report has no file of it), and its report root's run.json says so.
    run = RunRecord.read(col / "reports" / RUN_FILE)
    assert run.state == FINISHED and list(run.parties) == [COLLABORATOR], outputs[COLLABORATOR]
    final = run.parties[COLLABORATOR].final_model
    assert final.audited and final.round == 1 and final.leak is not None
    assert (col / "reports" / COLLABORATOR / "final_model" / "audit.json").is_file()
    assert not (agg / "reports" / "aggregator" / "round_0001.json").exists()


def test_the_tool_prepares_what_the_manual_path_does_with_owner_only_keys(prepared_federation):
    run_dir = prepared_federation  # `python -m workspace prepare`, 2 collaborators, mTLS (read only here)
    keys = sorted((run_dir).rglob("*.key"))
    # The CA's two keys, the aggregator's and each collaborator's: all owner-only.
    assert {k.name for k in keys} == {"root-ca.key", "signing-ca.key", "agg_localhost.key",
                                      *(f"col_{name}.key" for name in PREPARED_COLLABORATORS)}
    assert {str(k.relative_to(run_dir)): oct(mode(k)) for k in keys} == {
        str(k.relative_to(run_dir)): oct(0o600) for k in keys}
    # The aggregator's workspace is laid out like a clone (src/shipped/audit a link to its own audit/); each
    # collaborator's holds only the export: audit as a real src/shipped/audit, no top-level audit/.
    agg = run_dir / "aggregator"
    assert (agg / "src" / "shipped" / "audit").is_symlink() and (agg / "audit" / "__init__.py").is_file()
    for name in PREPARED_COLLABORATORS:
        col = run_dir / name
        assert not (col / "audit").exists()
        assert (col / "src" / "shipped" / "audit" / "round_audit.py").read_bytes() == \
            (ROOT / "audit" / "round_audit.py").read_bytes()


def test_a_bad_task_runner_setting_fails_at_plan_initialize_before_any_certificate(tmp_path):
    run_dir = tmp_path / "run"
    result = workspace_here("prepare", "--collaborators", 1, "--rounds", 1, "--dir", run_dir,
                            "--set", "task_runner.settings.audit.fpr_tolerance=[0.1, 2.0]")
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "task_runner.settings.audit.fpr_tolerance: 2.0 is outside (0, 1)" in lines[0]
    assert not list(run_dir.rglob("cert")) and not list(run_dir.rglob("*.key"))
