"""The local federation tooling's own logic, with stand-in processes: fast, no OpenFL processes started.

The real thing (fx, certificates, gRPC) is in test_federation_multiprocess.py.
"""

import json
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import psutil
import pytest

from workspace.federation import Outcome, _watch, metrics_file
from workspace.prepare import FederationLayout, SetupError, complete_archive
from workspace.processes import ProcessRegistry, describe_returncode
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


def test_the_exported_archive_gets_the_audit_package_and_no_secrets(tmp_path):
    agg = tmp_path / "aggregator"
    (agg / "audit").mkdir(parents=True)
    (agg / "audit" / "__init__.py").write_text("")
    (agg / "audit" / "report.py").write_text("x = 1\n")
    archive = agg / "aggregator.zip"
    with zipfile.ZipFile(archive, "w") as zf:  # what OpenFL 1.9's export packs
        for name in ("plan/plan.yaml", "plan/data.yaml", "src/taskrunner.py", "src/dataloader.py", "save/init.pbuf"):
            zf.writestr(name, "")
    complete_archive(archive, agg)
    names = set(zipfile.ZipFile(archive).namelist())
    assert {"audit/__init__.py", "audit/report.py", "src/taskrunner.py"} <= names
    with zipfile.ZipFile(archive, "a") as zf:
        zf.writestr("cert/server/agg_localhost.key", "secret")
    with pytest.raises(SetupError, match="private material"):
        complete_archive(archive, agg)


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


def run_watch(tmp_path, collaborators: dict, *, aggregator_exits=True, rounds=2, keep_going=False, timeout_s=30):
    layout = FederationLayout(run_dir=str(tmp_path), collaborators=list(collaborators), rounds=rounds, port=0,
                              use_tls=False)
    metrics_file(layout).parent.mkdir(parents=True)
    registry = ProcessRegistry(stop_grace_s=2)
    processes, logs = {}, {}

    def launch(name, code, *args):
        logs[name] = tmp_path / f"{name}.log"
        processes[name] = registry.start(name, [sys.executable, "-c", code, *map(str, args)], cwd=tmp_path,
                                         log_path=logs[name], env={})

    launch("aggregator", FAKE_AGGREGATOR, metrics_file(layout), rounds, "exit" if aggregator_exits else "stay")
    for name, code in collaborators.items():
        launch(name, code)
    outcome = Outcome(ok=False, rounds_done=0, rounds=rounds, seconds=0)
    messages = []
    try:
        _watch(layout, processes, logs, outcome, total=rounds, timeout_s=timeout_s, keep_going=keep_going,
               say=messages.append, progress=None, poll_s=0.05, begin=time.monotonic())
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
