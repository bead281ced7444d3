"""The local federation tooling's own logic, with stand-in processes: fast, no OpenFL processes started.

The real thing (fx, certificates, gRPC) is in test_federation_multiprocess.py.
"""

import inspect
import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from shared_runs import workspace_here
from workspace.federation import Outcome, _watch, metrics_file
from workspace.federation_state import FederationLayout, SetupError
from workspace.prepare import check_archive, check_port, check_run_dir, fx_exception, restrict_private_keys
from workspace.processes import ProcessRegistry, describe_returncode, is_running, snapshot
from workspace.progress import Liveness
from workspace.run_plan import PlanOverrideError, build_run_plan, merge_overrides, parse_set_option, port_is_free

ROOT = Path(__file__).resolve().parent.parent


def test_set_options_are_dotted_keys_with_yaml_values():
    assert parse_set_option("a.b.c=1") == {"a": {"b": {"c": 1}}}
    assert parse_set_option("x=[loss, logits]") == {"x": ["loss", "logits"]}
    assert parse_set_option("x=0.5") == {"x": 0.5}
    assert parse_set_option("x=true") == {"x": True}
    assert merge_overrides(["a.b=1", "a.c=2", "a.b=3"]) == {"a": {"b": 3, "c": 2}}
    for bad in ("novalue", "=1", "a..b=1", "a=[1"):
        with pytest.raises(PlanOverrideError, match="--set"):
            parse_set_option(bad)


def test_run_plan_sets_this_run_and_lets_overrides_win():
    config = build_run_plan(ROOT / "plan" / "plan.yaml", collaborators=3, rounds=4, port=51234, use_tls=False,
                            overrides=merge_overrides(["tasks.train.kwargs.epochs=1",
                                                       "aggregator.settings.poll_interval_s=2"]))
    assert config["aggregator"]["settings"]["rounds_to_train"] == 4
    assert config["aggregator"]["settings"]["persist_checkpoint"] is False
    assert config["aggregator"]["settings"]["poll_interval_s"] == 2
    assert config["data_loader"]["settings"]["collaborator_count"] == 3
    assert config["network"]["settings"] == {**config["network"]["settings"], "agg_addr": "localhost",
                                             "agg_port": 51234, "use_tls": False}
    assert config["tasks"]["train"]["kwargs"]["epochs"] == 1
    assert config["aggregator"]["template"] == "src.aggregator.AuditingAggregator"


@pytest.mark.parametrize("kwargs, overrides, message", [
    ({"collaborators": 0}, [], "--collaborators"),
    ({"rounds": 0}, [], "--rounds"),
    ({}, ["aggregator.settings.poll_interval_s=0.5"], "aggregator.settings.poll_interval_s"),
    ({}, ["network.settings.agg_addr=0.0.0.0"], "network.settings.agg_addr"),
])
def test_run_plan_rejects_bad_values_naming_them(kwargs, overrides, message):
    args = {"collaborators": 2, "rounds": 1, "port": 50000, "use_tls": True, **kwargs}
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        build_run_plan(ROOT / "plan" / "plan.yaml", overrides=merge_overrides(overrides), **args)


@pytest.mark.federation
def test_stopping_kills_the_whole_process_group(tmp_path):
    registry = ProcessRegistry(stop_grace_s=2)
    started = registry.start("sh", ["sh", "-c", "sleep 300 & sleep 300 & wait"], cwd=tmp_path,
                             log_path=tmp_path / "log", env={})
    done = registry.start("quick", ["true"], cwd=tmp_path, log_path=tmp_path / "log2", env={})
    done.popen.wait(timeout=10)
    time.sleep(0.3)
    children = psutil.Process(started.pid).children()
    assert len(children) == 2
    assert registry.stop_all() == ["sh"]
    _gone, alive = psutil.wait_procs(children, timeout=5)
    assert not alive  # the group went, not just its leader
    assert started.popen.returncode == -15  # SIGTERM first
    with pytest.raises(InterruptedError):  # nothing new starts once the run is being stopped
        registry.start("late", ["true"], cwd=tmp_path, log_path=tmp_path / "log3", env={})


def test_exit_codes_are_described_for_people():
    assert describe_returncode(-9) == "killed by SIGKILL"
    assert describe_returncode(3) == "exited with code 3"
    assert describe_returncode(None) == "still running"


def test_port_check_sees_a_listener(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert not port_is_free(s.getsockname()[1])


def test_the_exported_archive_must_carry_audit_in_src_and_no_secrets(tmp_path):
    archive = tmp_path / "aggregator.zip"
    exported = ("plan/plan.yaml", "plan/data.yaml", "src/__init__.py", "src/taskrunner.py", "src/dataloader.py",
                "save/init.pbuf")
    with zipfile.ZipFile(archive, "w") as zf:  # what OpenFL 1.9's export packs, without src/shipped/audit
        for name in exported:
            zf.writestr(name, "")
    with pytest.raises(SetupError, match=r"lacks \['src/shipped/audit/__init__.py'\]"):
        check_archive(archive)
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("src/shipped/audit/__init__.py", "")
    before = set(zipfile.ZipFile(archive).namelist())
    assert check_archive(archive) == archive
    assert set(zipfile.ZipFile(archive).namelist()) == before  # checked, not completed: export alone must do
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("cert/server/agg_localhost.key", "secret")
    with pytest.raises(SetupError, match="private material"):
        check_archive(archive)


def test_the_audit_package_travels_in_src_as_a_link_to_the_one_copy():
    link = ROOT / "src" / "shipped" / "audit"
    assert link.is_symlink() and link.resolve() == (ROOT / "audit").resolve()


AUDIT_IMPORT = "import src, audit; print(audit.__file__)"


def test_an_imported_workspace_finds_audit_in_src_only_when_it_has_no_top_level_audit(tmp_path):
    # What `fx workspace import` unpacks: src/ with a real src/shipped/audit, no audit/ at the top.
    imported = tmp_path / "imported"
    shutil.copytree(ROOT / "src", imported / "src", ignore=shutil.ignore_patterns("__pycache__"))
    clean = {"PATH": "/usr/bin:/bin"}
    found = subprocess.run([sys.executable, "-c", AUDIT_IMPORT], cwd=imported, capture_output=True, text=True,
                           env=clean, timeout=60)
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()) == imported / "src" / "shipped" / "audit" / "__init__.py"
    # A workspace with audit/ at the top (the repository, the aggregator's clone) keeps using that one.
    at_top = subprocess.run([sys.executable, "-c", AUDIT_IMPORT], cwd=ROOT, capture_output=True, text=True, env=clean,
                            timeout=60)
    assert Path(at_top.stdout.strip()) == ROOT / "audit" / "__init__.py", at_top.stderr
    # Neither: one line that says what is missing, not a ModuleNotFoundError from deep in the task runner.
    shutil.rmtree(imported / "src" / "shipped")
    missing = subprocess.run([sys.executable, "-c", AUDIT_IMPORT], cwd=imported, capture_output=True, text=True,
                             env=clean, timeout=60)
    assert missing.returncode != 0 and "ImportError: the audit package is missing" in missing.stderr


def test_port_option_is_a_free_port_in_range(tmp_path):
    import socket

    for bad in (0, -1, 65536, 70000, True):
        with pytest.raises(SetupError, match=rf"^--port {bad}: a TCP port is a whole number in 1\.\.65535$"):
            check_port(bad)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        taken = s.getsockname()[1]
        with pytest.raises(SetupError, match=rf"^--port {taken}: in use on 127\.0\.0\.1"):
            check_port(taken)
    assert check_port(taken) == taken  # closed again


def test_a_port_taken_after_prepare_is_found_before_any_participant_starts(tmp_path):
    """`start` of a prepared folder (its port is in its plan and certificates' federation): a port someone took
    since `prepare` is named before any participant starts, not in the aggregator's log after they all did."""
    import socket

    from workspace.federation import start

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        layout = FederationLayout(run_dir=str(tmp_path), collaborators=["collaborator1"], rounds=1, port=port,
                                  use_tls=False)
        registry = ProcessRegistry()
        with pytest.raises(SetupError) as err:
            start(layout, registry=registry, say=lambda _line: None)
    assert str(err.value) == (f"port {port} (network.settings.agg_port) is in use on 127.0.0.1; prepare again for a "
                              "new free port, or stop what listens there")
    assert registry.started == []


def test_dir_option_must_be_a_new_or_empty_folder(tmp_path):
    assert check_run_dir(tmp_path / "new") == (tmp_path / "new").resolve()
    assert not (tmp_path / "new").exists()  # checked, not made
    (tmp_path / "file").write_text("")
    with pytest.raises(SetupError, match="^--dir .*file: exists and is not a folder"):
        check_run_dir(tmp_path / "file")
    (tmp_path / "used" / "aggregator").mkdir(parents=True)
    with pytest.raises(SetupError, match="^--dir .*used: not empty"):
        check_run_dir(tmp_path / "used")


@pytest.mark.parametrize("override, message", [
    ("network=5", "--set network=5: network is a mapping in the plan (keys: defaults, settings)"),
    ("task_runner.settings.audit=null", "--set task_runner.settings.audit=null: task_runner.settings.audit is a "
                                        "mapping in the plan"),
    ("netwrk.settings.agg_port=1", "--set netwrk: 'netwrk' is not a section of the plan; sections: aggregator,"),
    ("tasks.train.kwargs.epochs.x=1", "--set tasks.train.kwargs.epochs.x: tasks.train.kwargs.epochs is 5 in the plan, "
                                      "a value with no keys"),
    ("network.settings.agg_port=70000", "--set network.settings.agg_port=70000: the tool sets this key; use --port"),
    ("network.settings={use_tls: false}", "--set network.settings.use_tls=false: the tool sets this key; use --no-tls"),
    ("aggregator.settings.rounds_to_train=2", "--set aggregator.settings.rounds_to_train=2: the tool sets this key; "
                                              "use --rounds"),
    ("data_loader.settings.collaborator_count=4", "--set data_loader.settings.collaborator_count=4: the tool sets "
                                                  "this key; use --collaborators"),
])
def test_set_keys_must_fit_the_plan(override, message):
    with pytest.raises(PlanOverrideError) as err:
        build_run_plan(ROOT / "plan" / "plan.yaml", collaborators=2, rounds=1, port=50000, use_tls=True,
                       overrides=merge_overrides([override]))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_new_keys_and_values_may_still_be_set():
    config = build_run_plan(ROOT / "plan" / "plan.yaml", collaborators=2, rounds=1, port=50000, use_tls=True,
                            overrides=merge_overrides(["task_runner.settings.per_collaborator.collaborator2.epochs=3",
                                                       "task_runner.settings.audit.gradient_layer=classifier.0",
                                                       "task_runner.settings.gate={action: withhold}"]))
    settings = config["task_runner"]["settings"]
    assert settings["per_collaborator"] == {"collaborator2": {"epochs": 3}}
    assert settings["audit"]["gradient_layer"] == "classifier.0"
    assert settings["gate"]["action"] == "withhold" and settings["gate"]["dp"]["max_retries"] == 2


def test_fx_failures_are_summed_up_by_fx_s_own_exception_line():
    output = "Traceback (most recent call last):\n  File ...\nEXCEPTION : data_loader.settings.dataset: unknown " \
             "dataset 'mnist'\nTraceback...\nValueError: data_loader.settings.dataset: unknown dataset 'mnist'\n"
    assert fx_exception(output) == "data_loader.settings.dataset: unknown dataset 'mnist'"
    assert fx_exception("Segmentation fault\n") is None


def test_private_keys_become_owner_only(tmp_path):
    for key in ("cert/ca/root-ca/private/root-ca.key", "cert/server/agg_localhost.key", "cert/client/col_a.key"):
        (tmp_path / key).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / key).write_text("secret")
        (tmp_path / key).chmod(0o644)
    (tmp_path / "cert" / "cert_chain.crt").write_text("public")
    (tmp_path / "cert" / "cert_chain.crt").chmod(0o644)
    assert len(restrict_private_keys(tmp_path)) == 3
    modes = {p.name: oct(p.stat().st_mode & 0o777) for p in (tmp_path / "cert").rglob("*") if p.is_file()}
    assert modes == {"root-ca.key": "0o600", "agg_localhost.key": "0o600", "col_a.key": "0o600",
                     "cert_chain.crt": "0o644"}
    assert restrict_private_keys(tmp_path / "elsewhere") == []


def cli(*args, timeout=120):
    """`python -m workspace ARGS` in a new interpreter, as a user runs it."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, "-m", "workspace", *map(str, args)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("args, line", [
    (["--set", "network=5"], "error: --set network=5: network is a mapping in the plan"),
    (["--port", "70000"], "error: --port 70000: a TCP port is a whole number in 1..65535"),
    (["--port", "0"], "error: --port 0: a TCP port is a whole number in 1..65535"),
    (["--set", "aggregator.settings.poll_interval_s=0"],
     "error: aggregator.settings.poll_interval_s: expected a whole number of seconds in [1, 3600]"),
    (["--poll-interval", "0"], "error: argument --poll-interval: expected a whole number >= 1 (seconds), got '0'"),
    (["--collaborators", "0"], "error: argument --collaborators: expected a whole number >= 1, got '0'"),
    (["--timeout", "0"], "error: --timeout 0: must be a number of seconds > 0"),
    # argparse's own errors were its usage block and then the error: one line now, naming the flag and the value
    (["--timeout", "abc"], "error: argument --timeout: expected a number of seconds > 0 (leave it out for no limit), "
                           "got 'abc'  (see python -m workspace run --help)"),
    (["--rounds", "1.5"], "error: argument --rounds: expected a whole number >= 1, got '1.5'"),
    (["--port", "abc"], "error: argument --port: expected a TCP port, a whole number in 1..65535, got 'abc'"),
    (["--poll-interval", "0.5"], "error: argument --poll-interval: expected a whole number >= 1 (seconds), got '0.5'"),
    (["--bogus"], "error: unrecognized arguments: --bogus"),
    # Before: accepted; the aggregator filled 19.3 GB in OpenFL's assigner, the status line was 10^9 characters wide.
    (["--rounds", "1000000000"], "error: argument --rounds: 1,000,000,000 rounds; at most 100,000, got '1000000000'"),
    # Before: accepted; it started making 100,000 certified workspaces for digits' 1,797 samples.
    (["--collaborators", "100000"], "error: --collaborators: 100,000 collaborators; at most 179 for digits (1,797 "
                                    "samples): every collaborator needs at least one sample of each set, and "
                                    "data_loader.settings.train_dataset_ratio 0.1 x 1,797 gives 179"),
    # Before: accepted; a client without a certificate claiming collaborator1 then got its tasks and the model.
    (["--set", "network.settings.require_client_auth=false"],
     "error: network.settings.require_client_auth: false turns client authentication (certificates) off: any "
     "process that reaches the aggregator's port could claim a collaborator's name"),
    # Before: silently ignored (OpenFL reads a missing defaults file as empty; the assigner swallows unknown keys).
    (["--set", "network.defaults=plan/defaults/netwrok.yaml"],
     "error: network.defaults: 'plan/defaults/netwrok.yaml' is no file OpenFL ships (it would be read as empty: the "
     "section would lose OpenFL's defaults); looked in "),
    (["--set", "assigner.settings.task_group=learning"],
     "error: assigner.settings.task_group: unknown setting (it would be ignored or fail later); known: task_groups, "
     "selected_task_group; did you mean task_groups?"),
    (["--set", "assigner.settings.task_groups=[{name: learning, percentage: 1.0, tasks: [train, validate]}]"],
     "error: assigner.settings.task_groups[0].tasks: 'validate' is not a task of the plan; its tasks: "
     "aggregated_model_validation, train, locally_tuned_model_validation, final_model_audit"),
    (["--set", "assigner.settings.task_groups=[{name: a, percentage: 0.5, tasks: [train]}, "
               "{name: b, percentage: 0.5, tasks: [train]}]"],
     "error: assigner.settings.task_groups: the percentages give 2 of the 3 collaborators a group"),
    # Before: refused only at the collaborator's first audit, after OpenFL wrote outside the run folder.
    (["--set", "task_runner.settings.per_collaborator={../../escaped_x: {epochs: 1}}"],
     "error: task_runner.settings.per_collaborator.../../escaped_x: collaborator name '../../escaped_x' is not a safe "
     "path component"),
    # Before: the suggested folder was .../data/MNIST, where the collaborators then looked in MNIST/MNIST/raw.
    # slow: the first to import torchvision's dataset readers (seconds)
    pytest.param(["--set", "data_loader.settings.dataset=mnist"],
                 "error: data_loader.settings.data_dir: 'data' is relative, but each collaborator runs in its own "
                 f"folder (<run>/collaboratorN/); give an absolute path, e.g. --set data_loader.settings.data_dir="
                 f"{ROOT / 'data'}\n", marks=pytest.mark.slow),
    (["--set", "task_runner.settings.audit.sample_size=1000000"],
     "error: task_runner.settings.audit.sample_size: 1,000,000 samples per set; at most 1,797, every sample of "
     "digits"),
])
def test_bad_options_fail_in_one_line_before_anything_is_made(tmp_path, args, line):
    run_dir = tmp_path / "run"
    result = workspace_here("run", "--dir", run_dir, *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(line), \
        result.stderr
    assert not run_dir.exists()  # no folder, no workspace, no certificate


@pytest.mark.federation  # child processes
@pytest.mark.parametrize("args, line", [
    (["run", "--dir", "{run}", "--rounds", "1.5"], "error: argument --rounds: expected a whole number >= 1, got '1.5'"),
    (["run", "--dir", "{run}", "--set", "network=5"], "error: --set network=5: network is a mapping in the plan"),
    (["start", "--dir", "nowhere", "--liveness", "1"], "error: argument --liveness: expected 0 (no liveness check) or "
                                                      "seconds >= 2, got '1'  (see python -m workspace start --help)"),
])
def test_the_command_in_its_own_process_fails_in_one_line_with_code_2(tmp_path, args, line):
    """The checks above call main() in this process; the entry point a user runs (`python -m workspace`, which ends
    with os._exit) prints the same one line and exits 2, for an argparse error and for a check of the plan."""
    run_dir = tmp_path / "run"
    result = cli(*[str(a).replace("{run}", str(run_dir)) for a in args])
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()] and result.stderr.startswith(line), \
        result.stderr
    assert not run_dir.exists()


def test_counts_are_bounded_by_the_machine_and_the_data(monkeypatch):
    from src.plan import bounds as plan_bounds

    # OpenFL's assigner: ~160 bytes per round for each task and collaborator, within an eighth of the memory
    assert plan_bounds.max_rounds(3, 3, memory=24 * 2**30) == 100_000
    assert plan_bounds.max_rounds(3, 97, memory=8 * 2**30) == 8 * 2**30 // 8 // (160 * 100)
    with pytest.raises(ValueError, match=r"^--rounds: 200,000 rounds; at most 100,000 "):
        plan_bounds.check_rounds("--rounds", 200_000, tasks=3, collaborators=2)
    # every collaborator needs a sample of each set: floor(1797 x 0.1) = 179 members to deal out
    ratios = {"train_dataset_ratio": 0.1, "test_dataset_ratio": 0.45, "audit_dataset_ratio": 0.45}
    assert plan_bounds.max_collaborators_for_data("digits", ratios) == (179, "train_dataset_ratio")
    plan_bounds.check_collaborators("k", 179, dataset="digits", ratios=ratios, prefix="")
    with pytest.raises(ValueError, match="^k: 180 collaborators; at most 179 for digits"):
        plan_bounds.check_collaborators("k", 180, dataset="digits", ratios=ratios, prefix="")
    # a process of ~0.44 GB per party on this machine
    assert plan_bounds.max_local_collaborators(memory=24 * 2**30) == 24 * 2**30 // (440 * 2**20) - 1


def test_the_status_line_does_not_grow_with_the_rounds():
    import io

    from workspace.progress import BAR_WIDTH, ProgressLine, progress_bar

    assert progress_bar(2, 5) == "##..."
    assert progress_bar(0, 10**9) == "." * BAR_WIDTH and progress_bar(10**9, 10**9) == "#" * BAR_WIDTH
    assert progress_bar(5 * 10**8, 10**9) == "#" * (BAR_WIDTH // 2) + "." * (BAR_WIDTH - BAR_WIDTH // 2)
    out = io.StringIO()
    ProgressLine(out).update(3, 10**9, {"aggregator": "serving"})
    assert len(out.getvalue()) < 200, len(out.getvalue())  # before: 10^9 characters, 2 GB of output


def test_a_port_in_use_and_a_used_folder_fail_before_anything_is_made(tmp_path):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        result = workspace_here("prepare", "--dir", tmp_path / "run", "--port", port)
    assert result.returncode == 2 and not (tmp_path / "run").exists()
    assert result.stderr.strip() == (f"error: --port {port}: in use on 127.0.0.1 (something listens there); choose "
                                     "another port, or leave --port out for a free one")
    (tmp_path / "file").write_text("")
    result = workspace_here("prepare", "--dir", tmp_path / "file")
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: --dir {tmp_path / 'file'}: exists and is not a folder; give a new or " \
                                    "empty folder"


# ---------------------------------------------------------------------------------------------------------
# the watcher, with python one-liners standing in for the aggregator and the collaborators

FAKE_AGGREGATOR = """
import json, sys, time
path, rounds, then_exit = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "exit"
for r in range(rounds):
    time.sleep(0.5)
    with open(path, "a") as f:
        f.write(json.dumps({"round_number": r, "elapsed_seconds": 0.5}) + "\\n")
if then_exit:
    sys.exit(0)
time.sleep(300)  # like OpenFL's server waiting for a dead collaborator's quit
"""


def run_watch(tmp_path, collaborators: dict, *, aggregator_exits=True, rounds=2, keep_going=False, timeout_s=30,
              liveness_s=None, aggregator=FAKE_AGGREGATOR, straggler_wait_s=0.0):
    layout = FederationLayout(run_dir=str(tmp_path), collaborators=list(collaborators), rounds=rounds, port=0,
                              use_tls=False)
    metrics_file(layout).parent.mkdir(parents=True)
    registry = ProcessRegistry(stop_grace_s=2)
    processes, logs = {}, {}

    def launch(name, code, *args):
        logs[name] = tmp_path / f"{name}.log"
        processes[name] = registry.start(name, [sys.executable, "-c", code, *map(str, args)], cwd=tmp_path,
                                         log_path=logs[name], env={"PYTHONUNBUFFERED": "1"})

    launch("aggregator", aggregator, metrics_file(layout), rounds, "exit" if aggregator_exits else "stay")
    for name, code in collaborators.items():
        launch(name, code)
    liveness = None
    if liveness_s is not None:
        liveness = Liveness(floor_s=liveness_s, straggler_wait_s=straggler_wait_s)
        for name, p in processes.items():
            liveness.add(name, p.pid, [logs[name]], collaborator=name != "aggregator", now=p.started_at)
    outcome = Outcome(ok=False, rounds_done=0, rounds=rounds, seconds=0)
    messages = []
    try:
        _watch(layout, processes, logs, outcome, total=rounds, timeout_s=timeout_s, keep_going=keep_going,
               say=messages.append, progress=None, poll_s=0.05, begin=time.monotonic(), liveness=liveness,
               stop=registry.stop)
    finally:
        stopped = registry.stop_all()
    return outcome, stopped, messages


SURVIVOR = "import time; time.sleep(1.5)"
DIES = "import os, signal, time; time.sleep(0.2); os.kill(os.getpid(), signal.SIGKILL)"


@pytest.mark.federation
def test_a_normal_end(tmp_path):
    outcome, stopped, _ = run_watch(tmp_path, {"c1": SURVIVOR, "c2": SURVIVOR})
    assert outcome.ok and not outcome.problems and stopped == []


@pytest.mark.federation
def test_a_death_stops_everything_at_once_by_default(tmp_path):
    began = time.monotonic()
    outcome, stopped, messages = run_watch(tmp_path, {"c1": "import time; time.sleep(60)", "c2": DIES})
    assert time.monotonic() - began < 10
    assert not outcome.ok
    assert "c2" in outcome.dead and "killed by SIGKILL" in outcome.dead["c2"]
    assert "participant died" in outcome.problems[0] and "c2" in outcome.problems[0]
    assert set(stopped) == {"aggregator", "c1"}
    assert any("c2" in m for m in messages)


@pytest.mark.federation
def test_keep_going_lets_the_others_finish_then_fails_naming_the_dead(tmp_path):
    outcome, stopped, _ = run_watch(tmp_path, {"c1": SURVIVOR, "c2": DIES}, aggregator_exits=False, keep_going=True)
    assert not outcome.ok
    assert outcome.problems == [f"all 2 rounds finished without: {outcome.dead['c2']}"]
    assert stopped == ["aggregator"]  # it would have waited forever for c2's quit signal


@pytest.mark.federation
def test_the_overall_timeout_names_what_still_runs(tmp_path):
    outcome, stopped, _ = run_watch(tmp_path, {"c1": "import time; time.sleep(60)"}, aggregator_exits=False,
                                    rounds=50, timeout_s=1.5)
    assert not outcome.ok
    assert "timed out after 1.5 s" in outcome.problems[0] and "still running: aggregator, c1" in outcome.problems[0]
    assert set(stopped) == {"aggregator", "c1"}


@pytest.mark.federation
def test_an_aggregator_that_fails_at_start_is_reported_with_its_last_lines(tmp_path):
    layout = FederationLayout(run_dir=str(tmp_path), collaborators=["c1"], rounds=1, port=0, use_tls=False)
    registry = ProcessRegistry(stop_grace_s=2)
    logs = {"aggregator": tmp_path / "agg.log", "c1": tmp_path / "c1.log"}
    code = "import sys; print('ValueError: aggregator.settings.poll_interval_s: must be >= 1 second, got 0'); sys.exit(1)"
    processes = {"aggregator": registry.start("aggregator", [sys.executable, "-c", code], cwd=tmp_path,
                                              log_path=logs["aggregator"], env={}),
                 "c1": registry.start("c1", [sys.executable, "-c", "import time; time.sleep(60)"], cwd=tmp_path,
                                      log_path=logs["c1"], env={})}
    outcome = Outcome(ok=False, rounds_done=0, rounds=1, seconds=0)
    try:
        _watch(layout, processes, logs, outcome, total=1, timeout_s=30, keep_going=False, say=print, progress=None,
               poll_s=0.05, begin=time.monotonic())
    finally:
        registry.stop_all()
    assert "aggregator" in outcome.problems[0] and "exited with code 1 after 0/1 rounds" in outcome.problems[0]
    assert "aggregator.settings.poll_interval_s" in outcome.problems[0]


@pytest.mark.federation
def test_python_dash_m_workspace_runs_from_the_namespace_package():
    result = subprocess.run([sys.executable, "-m", "workspace", "--help"], cwd=ROOT, capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0 and "prepare" in result.stdout and "start" in result.stdout
    assert not (ROOT / "workspace" / "__init__.py").exists()  # fx must keep finding its own `workspace` module


def test_layout_round_trips_through_federation_json(tmp_path):
    layout = FederationLayout(run_dir=str(tmp_path), collaborators=["c1"], rounds=3, port=5, use_tls=True)
    layout.save()
    assert json.loads((tmp_path / "federation.json").read_text())["status"] == "prepared"
    assert FederationLayout.load(tmp_path) == layout
    with pytest.raises(SetupError, match="not a prepared federation"):
        FederationLayout.load(tmp_path / "elsewhere")


def test_a_folder_with_an_earlier_runs_state_is_not_started(tmp_path):
    from workspace.federation import start

    layout = FederationLayout(run_dir=str(tmp_path), collaborators=["c1"], rounds=1, port=0, use_tls=False)
    (tmp_path / "aggregator" / "local_state").mkdir(parents=True)
    (tmp_path / "aggregator" / "local_state" / "tensor.db").write_bytes(b"")
    with pytest.raises(SetupError, match="tensor.db"):
        start(layout, registry=ProcessRegistry())
    layout.status = "finished"
    with pytest.raises(SetupError, match="already started"):
        start(layout, registry=ProcessRegistry())



# ---------------------------------------------------------------------------------------------------------
# liveness: a party that stops answering is named and ends the run as a dead one does


CHATTY = "import time\nfor i in range(200):\n    print('working', i, flush=True); time.sleep(0.05)"  # logs for 10 s
STOPS = "import os, signal, time; print('up', flush=True); time.sleep(0.3); os.kill(os.getpid(), signal.SIGSTOP)"
HANGS = "import time; time.sleep(60)"  # a deadlock: no log line, no CPU, state S
# training: CPU, no log line. 30 ms of CPU in every burst, then 60 ms asleep: a third of a core on an idle machine,
# over three times the share that counts as working (workspace.progress.BUSY_CPU_SHARE). The burst is counted in CPU
# time, not wall time, as a training's work is: on a loaded machine each burst takes longer but is still the same
# work, so the share stays above the threshold where a wall-clock burst falls below it when others share the core.
BUSY = """import time
end = time.monotonic() + 4
while time.monotonic() < end:
    spin = time.process_time() + 0.03
    while time.process_time() < spin:
        pass
    time.sleep(0.06)"""
SLOW_AGGREGATOR = """
import json, sys, time
time.sleep(3)  # waits for the collaborators' first round (c1 trains on, after it: no gap without progress)
with open(sys.argv[1], "a") as f:
    f.write(json.dumps({"round_number": 0, "elapsed_seconds": 3.0}) + "\\n")
"""


@pytest.mark.federation  # child processes
def test_a_stopped_collaborator_is_named_and_ends_the_run(tmp_path):
    began = time.monotonic()
    outcome, stopped, messages = run_watch(tmp_path, {"c1": CHATTY, "c2": STOPS}, rounds=50, liveness_s=2.0)
    assert time.monotonic() - began < 7  # stopped for the liveness setting, 2 s
    assert not outcome.ok and list(outcome.frozen) == ["c2"] and not outcome.dead
    assert "its process is stopped (state T" in outcome.frozen["c2"]
    assert outcome.problems == [f"stopped the federation: {outcome.frozen['c2']}"]
    assert outcome.frozen["c2"].startswith("c2 (pid ") and " stopped answering: " in outcome.frozen["c2"]
    assert any("c2" in m and "stopped answering" in m for m in messages)
    assert set(stopped) == {"aggregator", "c1", "c2"}  # the stopped one too (SIGTERM + SIGCONT)


@pytest.mark.federation  # child processes
def test_keep_going_stops_a_frozen_collaborator_lets_the_others_finish_and_does_not_idle(tmp_path):
    began = time.monotonic()
    outcome, stopped, _ = run_watch(tmp_path, {"c1": SURVIVOR, "c2": STOPS}, aggregator_exits=False,
                                    keep_going=True, liveness_s=2.0)
    assert time.monotonic() - began < 9  # the fake aggregator would wait 300 s for c2's quit signal
    assert not outcome.ok and set(outcome.dead) == {"c2"} and "stopped answering" in outcome.dead["c2"]
    assert outcome.dead["c2"].endswith("; stopped it")
    assert outcome.problems == [f"all 2 rounds finished without: {outcome.dead['c2']}"]
    assert stopped == ["aggregator"]


@pytest.mark.federation  # child processes
def test_a_silent_collaborator_while_rounds_go_on_is_named(tmp_path):
    outcome, _, _ = run_watch(tmp_path, {"c1": CHATTY, "c2": HANGS}, rounds=8, aggregator_exits=False,
                              liveness_s=2.0)
    assert list(outcome.frozen) == ["c2"]
    assert "though a round ended" in outcome.frozen["c2"] and "during its silence" in outcome.frozen["c2"]
    assert "process state S" in outcome.frozen["c2"]


@pytest.mark.federation  # child processes
def test_when_nothing_moves_every_party_is_named_longest_silent_first(tmp_path):
    outcome, _, _ = run_watch(tmp_path, {"c1": HANGS, "c2": HANGS}, rounds=1, aggregator=HANGS, liveness_s=2.0)
    assert list(outcome.frozen) == ["aggregator", "c1", "c2"]  # started (and fell silent) in that order
    assert all("no party made progress" in why for why in outcome.frozen.values())
    assert "stopped answering" in outcome.problems[0]


@pytest.mark.federation  # child processes
def test_a_party_working_without_logging_keeps_the_federation_live(tmp_path):
    # The first round: c1 trains (CPU, no log line), c2 and the aggregator wait without a sign of life.
    outcome, _, _ = run_watch(tmp_path, {"c1": BUSY, "c2": "import time; time.sleep(3.2)"}, rounds=1,
                              liveness_s=2.0, aggregator=SLOW_AGGREGATOR)
    assert outcome.ok and not outcome.frozen, outcome.problems


@pytest.mark.federation  # child processes
def test_survivors_waiting_for_the_straggler_cutoff_are_not_frozen(tmp_path):
    # keep-going, c2 dead: the aggregator and c1 wait silently for the straggler policy to end the round
    outcome, _, _ = run_watch(tmp_path, {"c1": "import time; time.sleep(4)", "c2": DIES}, rounds=1,
                              aggregator=SLOW_AGGREGATOR.replace("time.sleep(3)", "time.sleep(3.5)"),
                              keep_going=True, liveness_s=2.0, straggler_wait_s=5.0)
    assert not outcome.frozen and set(outcome.dead) == {"c2"}, outcome.problems
    assert outcome.problems == [f"finished without: {outcome.dead['c2']}"]


def test_the_liveness_window_grows_with_the_slowest_round():
    liveness = Liveness(floor_s=10)
    assert liveness.window([]) == 10 and liveness.window([2.0, 3.0]) == 10
    assert liveness.window([2.0, 30.0, 4.0]) == 90
    with pytest.raises(ValueError, match="liveness: 1 s is below 2 s"):
        Liveness(floor_s=1)


@pytest.mark.parametrize("value", ["-1", "1", "nan", "inf", "soon"])
def test_a_bad_liveness_option_is_one_clear_line(value):
    result = workspace_here("start", "--dir", "nowhere", "--liveness", value)
    assert result.returncode == 2
    assert result.stderr.strip() == f"error: argument --liveness: expected 0 (no liveness check) or seconds >= 2, " \
                                    f"got '{value}'  (see python -m workspace start --help)", result.stderr


def test_by_default_a_frozen_party_ends_the_run_though_there_is_no_timeout():
    """The issue's probe: with no --timeout (no limit) a frozen collaborator was waited for forever. The liveness
    check is on by default, in both commands that start a federation, and `start` uses it unless told 0."""
    from workspace.__main__ import build_parser
    from workspace.federation import start
    from workspace.progress import DEFAULT_LIVENESS_S

    assert 0 < DEFAULT_LIVENESS_S < float("inf")
    for argv in (["run"], ["start", "--dir", "x"]):
        args = build_parser().parse_args(argv)
        assert args.timeout is None and args.liveness == DEFAULT_LIVENESS_S and not args.keep_going
    assert inspect.signature(start).parameters["liveness_s"].default == DEFAULT_LIVENESS_S
    assert build_parser().parse_args(["start", "--dir", "x", "--liveness", "0"]).liveness == 0


# ---------------------------------------------------------------------------------------------------------
# a tooling killed outright: its participants die with it, and the folder says what happened


TOOL = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from workspace.processes import ProcessRegistry
registry = ProcessRegistry()
child = registry.start("child", [sys.executable, "-c", "import time; time.sleep(60)"], cwd=Path.cwd(),
                       log_path=Path(sys.argv[2]), env={})
print(child.pid, flush=True)
time.sleep(60)
"""


@pytest.mark.federation  # child processes
def test_participants_die_with_a_tooling_killed_outright(tmp_path):
    tool = subprocess.Popen([sys.executable, "-c", TOOL, str(ROOT), str(tmp_path / "child.log")], cwd=tmp_path,
                            stdout=subprocess.PIPE, text=True)
    try:
        child = int(tool.stdout.readline())
        assert is_running(child)
        tool.kill()
        tool.wait(timeout=10)
        deadline = time.monotonic() + 5
        while is_running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not is_running(child)
    finally:
        tool.kill()
        tool.wait()


def test_a_folder_left_running_by_a_killed_tooling_is_reported_stale(tmp_path):
    from workspace.federation import check_fresh, stale_state

    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    survivor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        layout = FederationLayout(run_dir=str(tmp_path), collaborators=["c1"], rounds=1, port=0, use_tls=False,
                                  status="running")
        layout.extra = {"tool": {"pid": gone.pid, "start_ticks": None},
                        "pids": {"aggregator": gone.pid, "c1": survivor.pid},
                        "start_ticks": {"aggregator": None, "c1": snapshot(survivor.pid).start_ticks}}
        message = stale_state(layout)
        assert message.startswith(f"stale: the tool (pid {gone.pid}) that started {tmp_path} is gone")
        assert f"aggregator (pid {gone.pid}) gone" in message
        assert f"c1 (pid {survivor.pid}) STILL RUNNING, stop it with: kill -- -{survivor.pid}" in message
        with pytest.raises(SetupError, match="^stale: the tool"):
            check_fresh(layout)
        # a recorded start time that does not match is another process that got the PID
        layout.extra["start_ticks"]["c1"] += 1
        assert f"c1 (pid {survivor.pid}) gone" in stale_state(layout)
        # while the tooling runs, the folder is running, not stale
        layout.extra["tool"] = {"pid": os.getpid(), "start_ticks": snapshot(os.getpid()).start_ticks}
        assert stale_state(layout).endswith("is still up; stop it with Ctrl-C or kill it")
        layout.status = "failed"
        assert stale_state(layout) is None
    finally:
        survivor.kill()
        survivor.wait()


def test_a_signal_during_an_import_is_raised_once_the_import_is_done(tmp_path, monkeypatch):
    """A SIGINT whose handler runs while a module is being imported (torch's import runs Python code from C++, where
    a raised exception aborts the process: SIGABRT, no clean-up) waits until the import is done: the module is whole,
    then Interrupted reaches the main thread."""
    import signal

    from workspace.__main__ import Interrupted, interrupt_handler

    (tmp_path / "slow_to_import.py").write_text(
        "import os, signal, time\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "for _ in range(20):\n"
        "    time.sleep(0.01)  # the handler runs here, inside the import\n"
        "WHOLE = True\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = ProcessRegistry()
    previous = signal.signal(signal.SIGINT, interrupt_handler(registry))
    after_import = []
    try:
        with pytest.raises(Interrupted):
            import slow_to_import  # noqa: F401
            after_import.append((slow_to_import.WHOLE, registry.cancelled))
            time.sleep(5)  # the signal, delivered again, interrupts this
    finally:
        signal.signal(signal.SIGINT, previous)
        sys.modules.pop("slow_to_import", None)
    assert after_import == [(True, False)]  # the import ran to its end, nothing cancelled inside it
    assert registry.interrupted_by == signal.SIGINT and registry.cancelled


def test_a_signal_while_the_main_thread_starts_a_process_is_delivered_once_it_is_recorded(tmp_path, monkeypatch):
    """A SIGINT whose handler runs while subprocess.Popen forks (where Python drops the handler's exception: logging's
    after-fork hook) is deferred and raised right after start() records the process, so the clean-up stops it and the
    run ends interrupted, not with a dropped exception and a process nobody stops."""
    import signal

    import workspace.processes as processes
    from workspace.__main__ import Interrupted, interrupt_handler

    registry = ProcessRegistry()
    real_popen = subprocess.Popen

    def popen_interrupted_while_forking(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)  # its handler runs at the next bytecode boundary: still inside Popen
        time.sleep(0.05)
        assert registry.launching and registry.cancelled  # deferred: nothing raised here
        return real_popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)

    monkeypatch.setattr(processes.subprocess, "Popen", popen_interrupted_while_forking)
    previous = signal.signal(signal.SIGINT, interrupt_handler(registry))
    try:
        with pytest.raises(Interrupted):
            registry.start("sleeper", ["sleep"], cwd=tmp_path, log_path=tmp_path / "sleeper.log", env={})
    finally:
        signal.signal(signal.SIGINT, previous)
        registry.stop_all()
    assert [s.name for s in registry.started] == ["sleeper"] and registry.stopped_running == ["sleeper"]
    assert registry.interrupted_by == signal.SIGINT and not registry.launching
