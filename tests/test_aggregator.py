"""src.aggregator.AuditingAggregator: plan settings, poll interval, bound gRPC server, callbacks."""

import inspect
import logging
import ipaddress
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from openfl.callbacks import Callback
from openfl.component import Aggregator
from openfl.transport import AggregatorGRPCServer
from openfl.transport.grpc.common import create_grpc_server

from src.aggregator import AuditingAggregator
from src.server.grpc_server import AddressBoundGRPCServer, bind_uri
from workspace.in_process import parse_plan
from workspace.plan_file import write_run_plan

ROOT = Path(__file__).resolve().parent.parent
TENSORS = {"w": np.zeros(3, dtype=np.float32)}


def make_aggregator(tmp_path, callback_objects=(), **settings):
    """A real AuditingAggregator built from the workspace plan the way `fx aggregator start` builds it."""
    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=2,
                                     overrides={"aggregator": {"settings": settings}}))
    if callback_objects:  # objects cannot be written into a YAML plan; in-process runs add them like this
        agg_settings = plan.config["aggregator"]["settings"]
        agg_settings["callbacks"] = [*(agg_settings.get("callbacks") or []), *callback_objects]
    return plan.get_aggregator(tensor_dict=TENSORS)


def test_the_plan_loads_the_auditing_aggregator(tmp_path):
    agg = make_aggregator(tmp_path)
    assert type(agg) is AuditingAggregator
    assert agg.poll_interval_s == 1  # plan/plan.yaml
    assert agg.report_dir == tmp_path.resolve() / "aggregator_report"  # in-process runs put it there


@pytest.mark.slow
def test_an_idle_request_is_held_then_told_to_ask_again(tmp_path):
    """A collaborator with nothing to do this round (here: a straggler) is not told to sleep whole seconds: its request
    is held for up to poll_interval_s, then answered "ask again now"."""
    agg = make_aggregator(tmp_path, poll_interval_s=1)
    tasks, round_number, sleep_time, quit_now = agg.get_tasks("collaborator1")
    assert tasks and sleep_time == 0 and not quit_now  # work to do: no waiting
    agg.stragglers = ["collaborator1"]  # OpenFL then has nothing for it this round
    tasks, _, sleep_time, quit_now = agg.get_tasks("collaborator1")
    assert not tasks and not quit_now
    assert sleep_time == 0


def _federation(tmp_path, **settings):
    """A real aggregator and two collaborators of the workspace plan (digits, 1 epoch), talking directly."""
    from workspace.in_process import DirectClient, initial_tensor_dict

    overrides = {"aggregator": {"settings": settings}, "tasks": {"train": {"kwargs": {"epochs": 1}}},
                 "task_runner": {"settings": {"audit": {"enabled": False}}}}
    plan_dir = write_run_plan(tmp_path, collaborators=2, rounds=2, overrides=overrides)
    plan = parse_plan(plan_dir)
    agg = plan.get_aggregator(tensor_dict=initial_tensor_dict(plan))
    cols = {name: parse_plan(plan_dir).get_collaborator(name, client=DirectClient(agg, name))
            for name in ("collaborator1", "collaborator2")}
    return agg, cols


def _run_round(col, round_num):
    tasks, task_round, sleep_time, quit_now = col.client.get_tasks()
    assert tasks and task_round == round_num and sleep_time == 0 and not quit_now
    for task in tasks:
        col.do_task(task, task_round)
    return [t if isinstance(t, str) else t.name for t in tasks]


@pytest.mark.federation
def test_a_held_request_gets_the_next_rounds_tasks_when_the_round_ends(tmp_path):
    """collaborator1 finishes round 0 and asks for more while collaborator2 still works: its request is held (not
    answered "sleep") and answered with every round-1 task as soon as collaborator2's last result ends round 0."""
    # without the final model's round, so that the quit signal follows round 1 (tests/test_federation_in_process.py
    # has the final round)
    agg, cols = _federation(tmp_path, poll_interval_s=120, final_model_audit=False)
    round0_tasks = _run_round(cols["collaborator1"], 0)
    answer = {}
    waiting = threading.Thread(target=lambda: answer.update(reply=agg.get_tasks("collaborator1")), daemon=True)
    waiting.start()
    tasks, _, _, _ = cols["collaborator2"].client.get_tasks()
    for task in tasks[:-1]:
        cols["collaborator2"].do_task(task, 0)
        assert waiting.is_alive() and agg.round_number == 0  # held while the round goes on
    cols["collaborator2"].do_task(tasks[-1], 0)  # its last result ends the round
    waiting.join(timeout=60)  # far below poll_interval_s: woken by the round's end, not by the timeout
    assert not waiting.is_alive()
    tasks, round_number, sleep_time, quit_now = answer["reply"]
    assert round_number == 1 and sleep_time == 0 and not quit_now
    assert [t if isinstance(t, str) else t.name for t in tasks] == round0_tasks  # every task of the round
    for name in ("collaborator1", "collaborator2"):  # and the round runs to its end with them
        for task in (tasks if name == "collaborator1" else cols[name].client.get_tasks()[0]):
            cols[name].do_task(task, 1)
    assert agg.round_number == 2 and agg.get_tasks("collaborator1")[3]  # the quit signal, at once


@pytest.mark.slow
def test_requests_beyond_the_held_limit_are_told_to_sleep(tmp_path):
    """At most MAX_HELD_REQUESTS idle requests hold one of the gRPC server's worker threads; the others get OpenFL's
    kind of answer, "sleep poll_interval_s", so results and model downloads always find a free thread."""
    from src.aggregator import MAX_HELD_REQUESTS

    agg = make_aggregator(tmp_path, poll_interval_s=2)
    agg.stragglers = ["collaborator1"]
    held = [threading.Thread(target=agg.get_tasks, args=("collaborator1",), daemon=True)
            for _ in range(MAX_HELD_REQUESTS)]
    for thread in held:
        thread.start()
    deadline = time.monotonic() + 30
    while agg._held_requests < MAX_HELD_REQUESTS and time.monotonic() < deadline:
        time.sleep(0.01)
    assert agg._held_requests == MAX_HELD_REQUESTS
    tasks, _, sleep_time, quit_now = agg.get_tasks("collaborator1")
    assert not tasks and not quit_now and sleep_time == 2
    for thread in held:
        thread.join(timeout=30)
    assert agg._held_requests == 0


def test_the_aggregator_uses_the_indexed_tensordb_its_callbacks_see(tmp_path):
    from src.server.tensordb import IndexedTensorDB

    agg = make_aggregator(tmp_path)
    assert isinstance(agg.tensor_db, IndexedTensorDB)
    assert agg.report.tensor_db is agg.tensor_db  # OpenFL handed its callbacks the same object
    assert set(agg.tensor_db.tensor_db["tensor_name"]) == set(TENSORS)  # the initial model, kept


def test_overriding_openfls_sleep_staticmethod_would_not_work(tmp_path):
    """Why AuditingAggregator rewrites get_tasks' answer: OpenFL calls Aggregator._get_sleep_time() on the class."""

    class StaticOverride(Aggregator):
        @staticmethod
        def _get_sleep_time():
            return 1

    agg = make_aggregator(tmp_path)
    agg.__class__ = StaticOverride  # the same object, with only OpenFL's get_tasks and the override
    agg.stragglers = ["collaborator1"]
    assert agg.get_tasks("collaborator1")[2] == 10


def test_quit_signal_is_not_delayed(tmp_path):
    agg = make_aggregator(tmp_path, poll_interval_s=7)
    agg.round_number = agg.rounds_to_train
    tasks, _, sleep_time, quit_now = agg.get_tasks("collaborator1")
    assert quit_now and not tasks and sleep_time == 0


@pytest.mark.parametrize("key, value, expected", [
    ("poll_interval_s", 0, "whole number of seconds in [1, 3600]"),
    ("poll_interval_s", -5, "whole number of seconds in [1, 3600]"),
    ("poll_interval_s", 3601, "whole number of seconds in [1, 3600]"),
    ("poll_interval_s", 0.5, "whole number of seconds"),
    ("poll_interval_s", "1", "whole number of seconds"),
    ("poll_interval_s", True, "whole number of seconds"),
    ("report_dir", 5, "expected a folder path"),
    ("report_dir", ["reports"], "expected a folder path"),
    ("report_dir", " ", "expected a folder path"),
    ("callbacks", "src.x.Y", "expected a list"),
    ("callbacks", [{"template": "no.such.Module"}], "callbacks[0].template: cannot import"),
    ("callbacks", [{"template": "openfl.callbacks.Callback", "setings": {}}], "callbacks[0]: unknown keys"),
    ("callbacks", [{"template": "collections.OrderedDict"}], "is not an openfl.callbacks.Callback"),
])
def test_bad_settings_fail_at_start_naming_the_key(tmp_path, key, value, expected):
    with pytest.raises(ValueError) as err:
        make_aggregator(tmp_path, **{key: value})
    assert f"aggregator.settings.{key}" in str(err.value)
    assert expected in str(err.value)


class Recorder(Callback):
    def __init__(self):
        super().__init__()
        self.rounds, self.aggregator = [], None

    def set_aggregator(self, aggregator):
        self.aggregator = aggregator

    def on_round_end(self, round_num, logs=None):
        self.rounds.append(round_num)


def test_more_callbacks_from_the_plan_or_as_objects(tmp_path):
    recorder = Recorder()
    agg = make_aggregator(tmp_path, [recorder], callbacks=[{"template": "openfl.callbacks.Callback"}])
    kinds = [type(c).__name__ for c in agg.callbacks.callbacks]
    assert kinds[:3] == ["AggregatorReportCallback", "Callback", "Recorder"]
    assert recorder.aggregator is agg and recorder.tensor_db is agg.tensor_db  # what an audit callback needs
    agg.callbacks.on_round_end(0, {})
    assert recorder.rounds == [0]


def test_aggregators_do_not_share_callbacks(tmp_path):
    """OpenFL's `callbacks=[]` default is one list that every Aggregator appends to; ours never touches it."""
    default_list = inspect.signature(Aggregator.__init__).parameters["callbacks"].default
    before = list(default_list)
    first = make_aggregator(tmp_path / "a")
    second = make_aggregator(tmp_path / "b")
    assert default_list == before
    assert first.callbacks.callbacks is not second.callbacks.callbacks
    assert not set(map(id, first.callbacks.callbacks)) & set(map(id, second.callbacks.callbacks))
    assert first.report is not second.report


def _listening_addresses(port):
    return {c.laddr.ip for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _NoConnector:
    connector = None


@pytest.mark.parametrize("server_class, agg_addr", [(AggregatorGRPCServer, None), (AddressBoundGRPCServer, "localhost"),
                                                    (AddressBoundGRPCServer, "127.0.0.1")])
def test_grpc_server_listening_address(server_class, agg_addr):
    port = _free_port()
    kwargs = {"agg_addr": agg_addr} if agg_addr else {}
    uri = server_class(_NoConnector(), port, use_tls=False, **kwargs).uri
    server = create_grpc_server(uri, False, None, None, None, False)  # what serve() does with self.uri
    server.start()
    try:
        addresses = _listening_addresses(port)
    finally:
        server.stop(0)
    assert addresses
    if server_class is AggregatorGRPCServer:  # OpenFL as shipped: every interface
        assert addresses <= {"::", "0.0.0.0"}
    else:
        assert all(ipaddress.ip_address(a.removeprefix("::ffff:")).is_loopback for a in addresses), addresses


def test_bind_uri_brackets_ipv6_literals():
    assert bind_uri("localhost", 5) == "localhost:5"
    assert bind_uri("::1", 5) == "[::1]:5"
    assert bind_uri("[::1]", 5) == "[::1]:5"
    assert bind_uri("10.0.0.2", 5) == "10.0.0.2:5"


def test_plan_get_server_builds_the_bound_server(tmp_path, monkeypatch):
    monkeypatch.setenv("FEDERATION_INSECURE", "tls")  # use_tls: false is refused unless the operator allows it
    plan = parse_plan(write_run_plan(tmp_path, collaborators=2, rounds=1, overrides={
        "network": {"settings": {"agg_addr": "localhost", "agg_port": 50123, "use_tls": False}}}))
    plan.get_aggregator(tensor_dict=TENSORS)
    server = plan.get_server()
    assert isinstance(server, AddressBoundGRPCServer)
    assert server.uri == "localhost:50123"


@pytest.mark.federation
@pytest.mark.skipif(not (Path(sys.executable).parent / "fx").exists(), reason="fx comes with openfl in the venv")
def test_fx_aggregator_start_rejects_a_bad_poll_interval(tmp_path, fx_fork):
    """OpenFL's entry point (tests/fx_forks.py): `fx aggregator start` fails at once, naming the key, before serving
    anything."""
    for name in ("plan", "src", "audit"):
        subprocess.run(["cp", "-r", str(ROOT / name), str(tmp_path / name)], check=True)
    (tmp_path / ".workspace").write_text((ROOT / ".workspace").read_text())
    plan = tmp_path / "plan" / "plan.yaml"
    text = plan.read_text()
    assert "poll_interval_s: 1 " in text
    plan.write_text(text.replace("poll_interval_s: 1 ", "poll_interval_s: 0 "))
    # A serving aggregator never exits by itself: that the command returned at all (within the timeout, which a
    # loaded machine's imports need) shows it stopped before serving.
    result = fx_fork(tmp_path, "aggregator", "start", timeout=300)
    assert result.returncode != 0
    assert ("aggregator.settings.poll_interval_s: expected a whole number of seconds in [1, 3600] (OpenFL sends it "
            "as an int32), got 0") in result.stdout


# ---------------------------------------------------------------------------------------------------------
# refused requests leave a trace on the aggregator's side: who claimed what, from where


def _serve(servicer, credentials_args):
    from openfl.protocols import aggregator_pb2_grpc

    server = create_grpc_server(servicer.uri, *credentials_args)
    aggregator_pb2_grpc.add_AggregatorServicer_to_server(servicer, server)
    server.start()
    return server


def _get_tasks(channel, agg, sender):
    from openfl.protocols import aggregator_pb2, aggregator_pb2_grpc
    from openfl.transport.grpc.common import create_header

    header = create_header(sender=sender, receiver=agg.uuid, federation_uuid=agg.federation_uuid,
                           single_col_cert_common_name=agg.single_col_cert_common_name)
    return aggregator_pb2_grpc.AggregatorStub(channel).GetTasks(aggregator_pb2.GetTasksRequest(header=header),
                                                                 timeout=30)


def _refusals(caplog):
    return [r.getMessage() for r in caplog.records
            if r.name == "src.server.grpc_server" and r.levelno == logging.WARNING and "Refused" in r.getMessage()]


def test_a_request_naming_an_unknown_collaborator_is_logged_with_its_address(tmp_path, caplog):
    import grpc

    agg = make_aggregator(tmp_path)
    port = _free_port()
    server = _serve(AddressBoundGRPCServer(agg, port, use_tls=False, agg_addr="127.0.0.1"),
                    (False, None, None, None, False))
    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            assert _get_tasks(channel, agg, "collaborator1").tasks  # a listed collaborator is served, silently
            assert _refusals(caplog) == []
            with pytest.raises(grpc.RpcError):
                _get_tasks(channel, agg, "=intruder")
    finally:
        server.stop(0)
    (message,) = _refusals(caplog)
    assert message.startswith("Refused a request from '=intruder' at ipv4:127.0.0.1:")
    assert "Sender in request header is not authorized" in message


@pytest.mark.slow
def test_a_certified_but_unlisted_collaborator_is_refused_unauthenticated_and_logged(tmp_path, caplog):
    """mTLS with a certificate the federation's CA signed, for a name not in the aggregator's cols.yaml."""
    import grpc
    from openfl.cryptography.ca import generate_root_cert, sign_certificate
    from openfl.cryptography.io import write_crt, write_key
    from openfl.cryptography.participant import generate_csr
    from openfl.transport.grpc.common import create_tls_channel

    ca_key, ca_cert = generate_root_cert()
    write_crt(ca_cert, tmp_path / "ca.crt")
    for name, is_server in (("localhost", True), ("intruder", False)):
        key, csr = generate_csr(name, server=is_server)
        write_crt(sign_certificate(csr, ca_key, ca_cert.subject), tmp_path / f"{name}.crt")
        write_key(key, tmp_path / f"{name}.key")
    agg = make_aggregator(tmp_path / "agg")
    port = _free_port()
    files = [str(tmp_path / f) for f in ("localhost.key", "localhost.crt", "ca.crt")]
    server = _serve(AddressBoundGRPCServer(agg, port, use_tls=True, agg_addr="localhost"), (True, *files, True))
    try:
        channel = create_tls_channel(f"localhost:{port}", str(tmp_path / "ca.crt"), True,
                                     str(tmp_path / "intruder.crt"), str(tmp_path / "intruder.key"))
        with channel, pytest.raises(grpc.RpcError) as refused:
            _get_tasks(channel, agg, "intruder")
    finally:
        server.stop(0)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    (message,) = _refusals(caplog)
    assert message.startswith("Refused a request from 'intruder' (certificate name 'intruder') at ipv")
    assert message.endswith("not an authorized collaborator (UNAUTHENTICATED)")
