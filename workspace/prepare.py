"""Prepare a local federation the way a deployment does, with OpenFL's own `fx` commands.

    <run>/aggregator/      the aggregator's workspace: this repository's plan (for this run), src/, audit/,
                           the federation's CA and the aggregator's certificate
    <run>/<collaborator>/  one workspace per collaborator, imported from the aggregator's export, with its
                           own key and a certificate the aggregator's CA signed
    <run>/federation.json  what `start` needs (port, TLS, names); <run>/setup.log: every command's output

Every check of the options and of the plan runs before any certificate or key is made: the options and the
run's plan in this process, then `fx plan initialize` (which builds the data loader and the task runner, so it
checks every setting the collaborators will check), and only then `fx workspace certify`.

`fx plan initialize` is an `fx` process of its own; the other commands run in turn in forks of one process that has
imported OpenFL's libraries (workspace/fx_worker.py), through OpenFL's own entry point.

mTLS (default): `fx plan initialize`, then `fx workspace certify`, `fx aggregator generate-cert-request` and
`certify` alongside `fx workspace export`; per collaborator `fx workspace import`, `fx collaborator create`,
`generate-cert-request`; the aggregator signs each request (`fx collaborator certify --request-pkg`, which also
adds the name to plan/cols.yaml), the collaborator imports the signed certificate (`--import`). Private keys
are made owner-only (0600). Without TLS (debugging) no certificates are made and plan/cols.yaml is written here.

The collaborators get `audit` the way a manual deployment does: inside the export, as src/shipped/audit
(src/__init__.py), with nothing added to the archive here.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
import zipfile
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Mapping

import yaml

from audit import atomic_write_text
from workspace.federation_state import AGGREGATOR, FederationLayout, SetupError
from workspace.plan_file import WORKSPACE_ROOT, collaborator_names
from workspace.fx_worker import RC_SUFFIX
from workspace.processes import ProcessRegistry, Started, describe_returncode, fx_environment, fx_executable
from workspace.run_lock import LOCK_FILE, FolderBusyError, FolderLock
from workspace.run_plan import (AGG_ADDR, aggregator_report_dir, build_run_plan, collaborator_report_dir, dump_plan,
                                free_port, insecure_allowed, port_problem)

# What the aggregator's workspace is made of, as in a clone of this repository: what OpenFL loads (plan/, src/,
# with its src/shipped/audit symlink), what our code imports (audit/), and what `fx workspace export` insists on
# packing (requirements.txt, .workspace).
WORKSPACE_PARTS = ("src", "audit")
WORKSPACE_FILES = ("requirements.txt", ".workspace")
# What each imported workspace must hold for `fx collaborator start` to run our task runner: `audit` arrives as
# src/shipped/audit, export's copy of the symlink.
ARCHIVE_MUST_HOLD = ("plan/plan.yaml", "plan/data.yaml", "src/__init__.py", "src/taskrunner.py", "src/dataloader.py",
                     "src/shipped/audit/__init__.py")
FX_TIMEOUT_S = 300
SIGNAL_POLL_S = 0.1  # the main thread wakes this often while set-up jobs run, to take a Ctrl-C at once
PORT_RANGE = (1, 65535)


# The set-up commands run in turn, each in a fork of one process that imported OpenFL's libraries, and those the
# workspace's code imports, once (workspace/fx_worker.py); `fx plan initialize` imports its workspace's own code (it
# builds the data loader and the task runner) in its fork, from its folder.
WORKER = Path(__file__).resolve().with_name("fx_worker.py")
WORKER_POLL_S = 0.02


class FxRunner:
    """Runs `fx` commands in participants' folders, logging their output to <run>/setup.log."""

    def __init__(self, registry: ProcessRegistry, setup_log: Path):
        self.registry = registry
        self.setup_log = setup_log
        fx_executable()  # no `fx` in this environment: said before anything starts
        self.log_dir = setup_log.parent / ".setup_logs"  # one file per running command, merged into setup.log
        self._worker_lock = threading.Lock()  # one command at a time in the worker
        # Started now, from the thread that makes the runner: the kernel kills a child when the thread that started
        # it ends (PR_SET_PDEATHSIG, workspace/processes.py), and the set-up's job threads end after each step. Its
        # imports overlap the checks that follow.
        self._worker: Started | None = self.registry.start(
            "fx set-up commands", [sys.executable, str(WORKER)], cwd=setup_log.parent,
            log_path=self.log_dir / "worker.log", env=fx_environment(), stdin=subprocess.PIPE)

    def run(self, cwd: Path, *args: str, timeout_s: float = FX_TIMEOUT_S) -> tuple[int, str]:
        """`fx ARGS` in `cwd`: its exit code and output (also appended to setup.log)."""
        command = "fx " + " ".join(args)
        self.registry.check_cancelled(f"`{command}`")
        log_path = self.log_dir / f"{time.monotonic_ns()}.log"
        began = time.monotonic()
        rc = self._in_worker(cwd, args, log_path, command, timeout_s)
        output = log_path.read_text(errors="replace") if log_path.exists() else ""
        log_path.unlink(missing_ok=True)
        with open(self.setup_log, "a", encoding="utf-8") as log:
            log.write(f"\n===== [{cwd}] {command}  (exit code {rc}, {time.monotonic() - began:.1f} s)\n{output}")
        return rc, output

    def __call__(self, cwd: Path, *args: str) -> None:
        """`fx ARGS` in `cwd`; a failure raises SetupError naming the command and fx's own reason."""
        rc, output = self.run(cwd, *args)
        command = "fx " + " ".join(args)
        if rc != 0:
            reason = fx_exception(output)
            if reason:  # fx's own one-line summary, e.g. the plan key a setting check named
                raise SetupError(f"{reason}  (`{command}` in {cwd}; full output: {self.setup_log})")
            tail = "\n".join(output.strip().splitlines()[-15:])
            raise SetupError(f"`{command}` failed in {cwd} (exit code {rc}); last lines:\n{tail}\n"
                             f"(full output: {self.setup_log})")

    def _in_worker(self, cwd: Path, args: tuple, log_path: Path, command: str, timeout_s: float) -> int:
        """The command's exit code, from the worker (started with the runner)."""
        with self._worker_lock:
            self.registry.check_cancelled(f"`{command}`")
            worker = self._worker
            if worker is None:
                raise RuntimeError(f"`{command}`: the set-up commands' process was already closed")
            done = Path(str(log_path) + RC_SUFFIX)
            log_path.parent.mkdir(parents=True, exist_ok=True)
            try:
                worker.popen.stdin.write((json.dumps({"cwd": str(cwd), "args": list(args), "log": str(log_path)})
                                          + "\n").encode())
                worker.popen.stdin.flush()
            except (BrokenPipeError, OSError):
                pass  # it has ended: said below
            deadline = time.monotonic() + timeout_s
            while not done.exists():
                if worker.popen.poll() is not None:  # stopped by an interrupt, or died
                    self.registry.check_cancelled(f"`{command}`")
                    worker_log = self.log_dir / "worker.log"
                    tail = worker_log.read_text(errors="replace")[-2000:] if worker_log.exists() else ""
                    raise SetupError(f"`{command}` in {cwd}: the process running fx's set-up commands "
                                     f"{describe_returncode(worker.popen.returncode)}\n{tail}")
                if time.monotonic() > deadline:
                    self.registry.stop(worker)
                    raise TimeoutError(f"`{command}` in {cwd} took more than {timeout_s:g} s (output: {log_path})")
                time.sleep(WORKER_POLL_S)
            rc = int(done.read_text())
            done.unlink()
            return rc

    def close(self) -> None:
        """End the worker: at the end of its input it exits."""
        with self._worker_lock:
            worker, self._worker = self._worker, None
        if worker is None:
            return
        try:
            worker.popen.stdin.close()
            worker.popen.wait(timeout=FX_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired):
            pass
        self.registry.stop(worker)  # nothing left of it, whatever happened
        self.registry.forget(worker)


def fx_exception(output: str) -> str | None:
    """The message of the exception an fx command died of: fx prints `EXCEPTION : <message>` before the traceback."""
    found = None
    for line in output.splitlines():
        if line.startswith("EXCEPTION : "):
            found = line[len("EXCEPTION : "):].strip()
    return found or None


def check_run_dir(run_dir: Path) -> Path:
    """--dir must be a new or empty folder: every run gets fresh folders (its lock file aside, see run_lock)."""
    run_dir = Path(run_dir).resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise SetupError(f"--dir {run_dir}: exists and is not a folder; give a new or empty folder")
    if run_dir.is_dir() and any(p.name != LOCK_FILE for p in run_dir.iterdir()):
        raise SetupError(f"--dir {run_dir}: not empty; every run gets fresh folders (so no participant can pick "
                         "up an earlier run's state): give a new or empty folder")
    return run_dir


def check_port(port) -> int:
    """--port: a TCP port in 1..65535 that nothing on 127.0.0.1 listens on now, and that this user may listen on."""
    low, high = PORT_RANGE
    if isinstance(port, bool) or not isinstance(port, int) or not low <= port <= high:
        raise SetupError(f"--port {port}: a TCP port is a whole number in {low}..{high}")
    problem = port_problem(port)
    if problem:
        raise SetupError(f"--port {port}: {problem}; choose another port, or leave --port out for a free one")
    return port


class RunFolder:
    """The run folder `prepare` claims: made (with any missing parent) and locked before anything is written in it;
    everything made in it is removed again if the set-up fails or is interrupted (`remove`)."""

    def __init__(self, run_dir: Path, lock: FolderLock | None = None):
        self.root = Path(run_dir)
        self.lock = lock or FolderLock(self.root)
        self.made: list[Path] = []  # folders this command made, outermost first

    def claim(self) -> None:
        missing = []
        for folder in [self.root, *self.root.parents]:
            if folder.exists():
                break
            missing.append(folder)
        try:
            for folder in reversed(missing):  # os.mkdir: whoever makes a folder knows it made it
                try:
                    os.mkdir(folder)
                    self.made.append(folder)
                except FileExistsError:
                    pass
        except OSError as err:
            self.remove()
            raise SetupError(f"--dir {self.root}: cannot make it ({err.strerror})") from None
        try:
            self.lock.acquire()
        except FolderBusyError as err:
            self.made.clear()  # the folder is the other run's now: nothing here is removed
            raise SetupError(str(err)) from None
        try:
            check_run_dir(self.root)  # again, under the lock: another command may have filled it meanwhile
        except SetupError:
            self.lock.release()
            self.made.clear()
            raise

    def remove(self) -> None:
        """Remove everything this command made: the folder's contents (it was empty when claimed), the lock file, and
        the folder and its parents if this command made them."""
        if self.lock.held and self.root.is_dir():
            for entry in self.root.iterdir():
                if entry.name == LOCK_FILE:
                    continue
                if entry.is_dir() and not entry.is_symlink():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    entry.unlink(missing_ok=True)
        self.lock.release(remove=True)
        for folder in reversed(self.made):
            try:
                folder.rmdir()
            except OSError:
                break
        self.made.clear()


def check_report_folders(config: Mapping) -> None:
    """The report folders the plan puts outside the run folder (an absolute aggregator.settings.report_dir or
    task_runner.settings.audit.report_dir) can be written, before any folder or certificate is made (a read-only one
    stopped the run only when its index was written). The run folder itself is checked when it is claimed."""
    from audit import SettingsError
    from src.plan.paths import check_writable

    for key, value in (("aggregator.settings.report_dir", aggregator_report_dir(config)),
                       ("task_runner.settings.audit.report_dir", collaborator_report_dir(config))):
        if os.path.isabs(os.path.expanduser(value)):
            try:
                check_writable(key, value)
            except SettingsError as err:
                raise SetupError(str(err)) from None


def restrict_private_keys(ws: Path) -> list[Path]:
    """Make every private key under ws/cert owner-only: OpenFL 1.9 writes the CA's keys 0644 (in 0700 folders)."""
    keys = sorted((ws / "cert").rglob("*.key")) if (ws / "cert").is_dir() else []
    for key in keys:
        key.chmod(0o600)
    return keys


def check_in_process(config: Mapping, names: list[str]) -> None:
    """What `fx plan initialize` and each collaborator would find, in this process before any folder: the data loader
    and the task runner built from the plan, and each party's data read by the loader's readers
    (workspace.plan_file.check_buildable, check_party_data)."""
    from src.dataloader import clear_dataset_cache
    from src.data.datasets import DatasetUnavailableError
    from workspace.plan_file import check_buildable, check_party_data

    try:
        check_buildable(config)
        check_party_data(config, names)
    except DatasetUnavailableError as err:
        raise SetupError(str(err)) from None
    finally:
        clear_dataset_cache()  # the collaborators read their own copies


def prepare(run_dir: Path, *, collaborators: int, rounds: int, use_tls: bool = True, client_auth: bool = True,
            port: int | None = None, overrides: Mapping | None = None, base_plan: Path | None = None,
            registry: ProcessRegistry, say: Callable[[str], None] = print,
            lock: FolderLock | None = None) -> FederationLayout:
    """Make every participant's workspace (and, with TLS, its certificates) under run_dir. `lock` (held on return,
    so that `run` starts the folder it prepared) is taken before anything is written there; if anything fails or
    an interrupt comes, everything made is removed and nothing goes on running."""
    start = time.monotonic()
    # Every check of the options and of the plan first: nothing is made if one fails.
    run_dir = check_run_dir(run_dir)
    port = free_port() if port is None else check_port(port)
    config = build_run_plan(base_plan or WORKSPACE_ROOT / "plan" / "plan.yaml", collaborators=collaborators,
                            rounds=rounds, port=port, use_tls=use_tls, overrides=overrides, client_auth=client_auth,
                            workspace=run_dir / collaborator_names(max(1, collaborators))[0])  # all are alike
    insecure = insecure_allowed(use_tls, client_auth)
    names = collaborator_names(collaborators)
    check_report_folders(config)
    check_in_process(config, names)
    folder = RunFolder(run_dir, lock)
    try:
        folder.claim()
        return _prepare_in(folder, config, names, rounds=rounds, port=port, use_tls=use_tls, insecure=insecure,
                           registry=registry, say=say, began=start)
    except BaseException:
        registry.winding_down = True  # from here a signal only hastens the clean-up
        registry.cancel()
        registry.stop_all()
        folder.remove()
        raise


def _prepare_in(folder: RunFolder, config: Mapping, names: list[str], *, rounds: int, port: int, use_tls: bool,
                insecure: list[str], registry: ProcessRegistry, say: Callable[[str], None],
                began: float) -> FederationLayout:
    run_dir = folder.root
    layout = FederationLayout(run_dir=str(run_dir), collaborators=names, rounds=rounds, port=port, use_tls=use_tls,
                              aggregator_report_dir=aggregator_report_dir(config),
                              collaborator_report_dir=collaborator_report_dir(config), insecure=insecure)
    fx = FxRunner(registry, run_dir / "setup.log")
    agg = run_dir / AGGREGATOR

    say(f"preparing {len(names)} collaborators + aggregator in {run_dir} ({'mTLS' if use_tls else 'no TLS'}, "
        f"port {port})")
    make_aggregator_workspace(agg, config, names, use_tls)
    # Builds the data loader and the task runner: every setting check the collaborators will make, before any
    # certificate exists (and it writes save/init.pbuf, which the export packs).
    fx(agg, "plan", "initialize")

    def aggregator_certificates():
        fx(agg, "workspace", "certify")
        fx(agg, "aggregator", "generate-cert-request", "--fqdn", AGG_ADDR)
        fx(agg, "aggregator", "certify", "--fqdn", AGG_ADDR, "--silent")
        restrict_private_keys(agg)

    say("  plan checked and initialised; making certificates and the export for the collaborators")
    # Independent: the export packs no certificate (and is checked for none below).
    in_parallel([*([aggregator_certificates] if use_tls else []), lambda: fx(agg, "workspace", "export")], registry)
    archive = check_archive(agg / f"{AGGREGATOR}.zip")

    signing = threading.Lock()

    def collaborator_chain(index: int, name: str) -> None:
        received = run_dir / f"{name}.zip"  # "sent" to the collaborator; import unpacks it into <run>/<name>
        registry.check_cancelled(f"the copy of the export for {name}")
        shutil.copy2(archive, received)
        fx(run_dir, "workspace", "import", "--archive", received.name)
        received.unlink()
        ws = run_dir / name
        fx(ws, "collaborator", "create", "-n", name, "-d", str(index), "--silent")
        if not use_tls:
            return
        fx(ws, "collaborator", "generate-cert-request", "-n", name, "--silent")
        restrict_private_keys(ws)
        request, signed = f"col_{name}_to_agg_cert_request.zip", f"agg_to_col_{name}_signed_cert.zip"
        # The request package travels to the aggregator, the signed certificate back. One signature at a time:
        # `fx collaborator certify --request-pkg` signs the first *.csr it finds in cert/client and rewrites
        # plan/cols.yaml.
        with signing:
            shutil.move(ws / request, agg / request)
            fx(agg, "collaborator", "certify", "--request-pkg", request, "--silent")
            (agg / request).unlink()
            shutil.move(agg / signed, ws / signed)
        fx(ws, "collaborator", "certify", "--import", signed)
        (ws / signed).unlink()

    in_parallel([lambda i=i, n=n: collaborator_chain(i, n) for i, n in enumerate(names, 1)], registry)
    fx.close()
    check_prepared(run_dir, names, use_tls)
    shutil.rmtree(fx.log_dir, ignore_errors=True)
    layout.prepared_at = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    layout.setup_seconds = round(time.monotonic() - began, 1)
    layout.save()
    say(f"  prepared in {layout.setup_seconds:.0f} s")
    return layout


def in_parallel(jobs: list[Callable[[], object]], registry: ProcessRegistry, workers: int = 2) -> None:
    """Run jobs two at a time (one copies or moves files while the other waits for its fx command); the first error is
    raised.

    On an error or an interrupt every queued job is dropped, the registry is cancelled (a running job stops at its
    next step: no process starts, no copy is made, ProcessRegistry.check_cancelled) and its processes are stopped;
    this returns only when no job runs any more, so nothing of this step goes on behind the caller.
    """
    def guarded(job):
        def run():
            registry.check_cancelled()  # a job whose turn comes after an interrupt does nothing
            return job()
        return run

    pool = ThreadPoolExecutor(max_workers=workers)
    try:
        pending = {pool.submit(guarded(job)) for job in jobs}
        while pending:
            # Never a blocking wait: the kernel may hand a signal to a worker thread, and Python runs its handler only
            # when the main thread runs bytecode (a wait for a 10 s fx command delayed Ctrl-C by 10 s).
            done, pending = wait(pending, timeout=SIGNAL_POLL_S, return_when=FIRST_EXCEPTION)
            for future in done:
                future.result()  # the first error
    except BaseException:
        registry.winding_down = True  # a signal from here on only hastens the stop
        registry.cancel()
        pool.shutdown(wait=False, cancel_futures=True)
        registry.stop_all()
        raise
    finally:
        pool.shutdown(wait=True)


def make_aggregator_workspace(agg: Path, config: Mapping, names: list[str], use_tls: bool) -> None:
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    agg.mkdir(parents=True)
    for part in WORKSPACE_PARTS:  # symlinks kept: src/shipped/audit stays a link to this workspace's audit/
        shutil.copytree(WORKSPACE_ROOT / part, agg / part, ignore=ignore, symlinks=True)
    for name in WORKSPACE_FILES:
        shutil.copy2(WORKSPACE_ROOT / name, agg / name)
    for folder in ("plan", "save", "logs", "data"):
        (agg / folder).mkdir(exist_ok=True)
    atomic_write_text(agg / "plan" / "plan.yaml", dump_plan(config))
    # With TLS, `fx collaborator certify` registers each collaborator it signs; without, the list is written here.
    atomic_write_text(agg / "plan" / "cols.yaml", yaml.safe_dump({"collaborators": [] if use_tls else names}))
    # Each collaborator's `fx collaborator create` adds its own `name,shard` line to its copy.
    atomic_write_text(agg / "plan" / "data.yaml",
                      "# collaborator_name,shard number (1-based; data_loader.settings.collaborator_count shards)\n")


def check_archive(archive: Path) -> Path:
    """The exported workspace must hold what our task runner imports, and no secrets.

    Nothing is added to OpenFL's export: `audit` is in it as src/shipped/audit, as in a manual deployment.
    `fx workspace import` only unpacks the archive (it installs nothing from requirements.txt): the
    collaborators here run in the project's venv.
    """
    if not archive.exists():
        raise SetupError(f"`fx workspace export` did not write {archive}")
    with zipfile.ZipFile(archive) as zf:
        present = set(zf.namelist())
    missing = [n for n in ARCHIVE_MUST_HOLD if n not in present]
    if missing:
        raise SetupError(f"{archive} lacks {missing}: the collaborators could not run the task runner")
    secrets = [n for n in present if n.startswith("cert/") or n.endswith((".key", ".pem"))]
    if secrets:
        raise SetupError(f"{archive} holds private material {secrets}; it must not leave the aggregator")
    return archive


def check_prepared(run_dir: Path, names: list[str], use_tls: bool) -> None:
    agg = run_dir / AGGREGATOR
    cols = (yaml.safe_load((agg / "plan" / "cols.yaml").read_text()) or {}).get("collaborators") or []
    if sorted(cols) != sorted(names):
        raise SetupError(f"{agg / 'plan' / 'cols.yaml'} lists {cols}, expected {names}")
    for name in names:
        ws = run_dir / name
        data_lines = [line.split(",")[0] for line in (ws / "plan" / "data.yaml").read_text().splitlines()
                      if line and not line.startswith("#")]
        if name not in data_lines:
            raise SetupError(f"{ws / 'plan' / 'data.yaml'} has no line for {name}")
        if use_tls:
            for cert in (f"cert/client/col_{name}.crt", f"cert/client/col_{name}.key", "cert/cert_chain.crt"):
                if not (ws / cert).is_file():
                    raise SetupError(f"{ws / cert} missing after the certificate exchange")
        if (ws / "plan" / "plan.yaml").read_bytes() != (agg / "plan" / "plan.yaml").read_bytes():
            raise SetupError(f"{ws}/plan/plan.yaml differs from the aggregator's: the federation ids would not match")
