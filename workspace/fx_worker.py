"""OpenFL's `fx` set-up commands, each in a process forked from one that has imported what OpenFL imports.

An `fx` start imports OpenFL's libraries (torch, pandas, gRPC, cryptography, ...: about 2 CPU-seconds) before a
certificate, export or import command that itself takes a fraction of that. This process imports those libraries
once, and nothing of OpenFL: each command runs in a fork of it, which imports OpenFL's own modules (a tenth of a second)
in the command's folder and runs OpenFL's entry point (`openfl.interface.cli.entry`, what the `fx` script calls), as a
new `fx` process would. OpenFL's modules are imported in the fork, not here, because they read the working folder at
import (openfl/interface/cli_helper.py: CERT_DIR = Path("cert").absolute()), and so that no command's state (its
logging set-up, sys.path) reaches the next one.

Run as a script (`python workspace/fx_worker.py`), so that it imports nothing of this repository. It reads one command
per line on stdin, as JSON: {"cwd": folder, "args": [fx arguments], "log": file}; the command's stdin is /dev/null and
its stdout and stderr go to `log`; then it writes the exit code to `log` + ".rc" (written whole, then renamed). It
ends at the end of stdin. Its caller is workspace.prepare.FxRunner.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import traceback

RC_SUFFIX = ".rc"
# What openfl.federated and openfl.interface import that costs time (openfl/federated/task/runner_pt.py: torch); a
# library missing here is imported by the command itself, only slower.
LIBRARIES = ("torch", "pandas", "numpy", "yaml", "click", "dynaconf", "flask", "rich", "grpc", "google.protobuf",
             "cryptography.x509", "cryptography.hazmat.primitives.asymmetric.rsa", "tqdm")


def _command(cwd: str, args: list[str], log: str) -> int:
    """In the fork: `fx ARGS` in `cwd`, output to `log`; the exit code the `fx` script would end with."""
    os.chdir(cwd)
    with open(log, "ab") as out:
        for fd in (1, 2):
            os.dup2(out.fileno(), fd)
    sys.argv = ["fx", *args]
    try:
        from openfl.interface.cli import entry

        entry()
        return 0
    except SystemExit as stop:  # click ends every command so
        return stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:  # entry() printed "EXCEPTION : ..." and raised it again: Python prints it and exits 1
        traceback.print_exc()
        return 1


def run_command(cwd: str, args: list[str], log: str) -> int:
    """Fork, run the command in the child, and return its exit code (128 + N if a signal N ended it)."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _command(cwd, args, log)
        finally:
            try:
                sys.stdout.flush()
                sys.stderr.flush()
            finally:
                os._exit(code if 0 <= code < 256 else 1)  # no clean-up of the parent's objects in the child
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def main() -> int:
    for name in LIBRARIES:
        try:
            importlib.import_module(name)
        except Exception:
            pass
    # The commands come on a copy of stdin; stdin itself becomes /dev/null, as for `fx` run by the tooling: a command
    # that asks a question gets an end of file, never the next command.
    commands = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdin = open(os.devnull)
    for line in commands:
        if not line.strip():
            continue
        command = json.loads(line)
        code = run_command(command["cwd"], list(command["args"]), command["log"])
        done = command["log"] + RC_SUFFIX
        with open(done + ".tmp", "w") as f:
            f.write(str(code))
        os.replace(done + ".tmp", done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
