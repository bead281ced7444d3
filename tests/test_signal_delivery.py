"""How the demo's signal handling (workspace.interrupts.DemoSignals) delivers a SIGTERM that comes while a module is
being imported: in a small child interpreter (no torch), because a signal that took its default action would end the
test's own process.

- An import in another thread (the report worker importing matplotlib) does not hold the signal back: the main thread
  is interrupted at once.
- A signal that comes during the main thread's import waits for it to end; if the demo leaves the handlers' scope
  before then, the signal is raised as it leaves, never delivered again to a process whose handlers are gone (the
  default action: exit 143, no line, no clean-up).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a new interpreter each

ROOT = Path(__file__).resolve().parents[1]


def _child(tmp_path: Path, body: str, modules: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    for name, text in (modules or {}).items():
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
    script = tmp_path / "child.py"
    script.write_text(f"import sys\nsys.path[:0] = [{str(ROOT)!r}, {str(tmp_path)!r}]\n" + textwrap.dedent(body))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60)


def test_an_import_in_another_thread_does_not_hold_the_signal_back(tmp_path):
    """The report worker importing (here: an import that waits until the main thread is interrupted) does not hold
    back the main thread's Interrupted: raising there is safe, the import is in another thread, still going on."""
    proc = _child(tmp_path, """
        import os, signal, threading, time
        import gate
        from workspace.interrupts import DemoSignals, Interrupted

        def worker():
            import waits_in_its_import  # noqa: F401
        try:
            with DemoSignals():
                threading.Thread(target=worker, daemon=True).start()
                assert gate.entered.wait(10)
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)
                print("not interrupted within 5 s")
        except Interrupted as stop:
            importing = sys.modules["waits_in_its_import"].__spec__._initializing
            print(f"interrupted ({stop}) while the other thread imports: {importing}")
            gate.release.set()
            sys.exit(128 + stop.signum)
        """, modules={
            "gate": "import threading\nentered, release = threading.Event(), threading.Event()\n",
            "waits_in_its_import": "import gate\ngate.entered.set()\ngate.release.wait(30)\n"})
    assert (proc.returncode, proc.stdout) == (143, "interrupted (SIGTERM) while the other thread imports: True\n"), \
        (proc.returncode, proc.stdout, proc.stderr)


def test_a_signal_during_the_main_threads_import_waits_for_the_import(tmp_path):
    """The handler runs inside the import (where torch's C++ frames could not unwind an exception): the import ends
    whole, then Interrupted reaches the main thread."""
    proc = _child(tmp_path, """
        import time
        from workspace.interrupts import DemoSignals, Interrupted

        try:
            with DemoSignals():
                import kills_itself
                print("imported whole:", kills_itself.WHOLE)
                time.sleep(5)
                print("not interrupted within 5 s")
        except Interrupted as stop:
            print(f"interrupted ({stop})")
            sys.exit(128 + stop.signum)
        """, modules={"kills_itself": """
            import os, signal, time
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(20):
                time.sleep(0.01)  # the handler runs here, inside the import
            WHOLE = True
            """})
    assert (proc.returncode, proc.stdout) == (143, "imported whole: True\ninterrupted (SIGTERM)\n"), proc.stderr


def test_a_signal_deferred_past_the_handlers_scope_is_raised_as_it_ends(tmp_path):
    """The import ends and the demo leaves DemoSignals before the deferred signal is delivered again: it is raised as
    the scope ends (the demo says so and exits 143), not re-sent to a process whose SIGTERM action is the default."""
    proc = _child(tmp_path, """
        import time
        from workspace.interrupts import DemoSignals, Interrupted

        try:
            with DemoSignals():
                import kills_itself  # noqa: F401
            time.sleep(0.5)
            print("the signal was lost")
        except Interrupted as stop:
            print(f"interrupted ({stop})")
            sys.exit(128 + stop.signum)
        """, modules={"kills_itself": """
            import os, signal, time
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.01)  # the handler runs here, inside the import
            """})
    assert (proc.returncode, proc.stdout) == (143, "interrupted (SIGTERM)\n"), (proc.returncode, proc.stderr)
