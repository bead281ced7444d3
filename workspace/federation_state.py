"""A prepared federation's state: what `python -m workspace prepare` made (the run folder, the collaborators' names,
rounds, port, TLS), saved as <run>/federation.json and read back by `start` (workspace.prepare, workspace.federation).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from audit import atomic_write_json
from workspace.run_plan import AGG_ADDR

AGGREGATOR = "aggregator"
STATE_FILE = "federation.json"


class SetupError(RuntimeError):
    """A set-up or start that cannot go on; the message says why in one line and names the flag or file."""


@dataclass
class FederationLayout:
    """What `prepare` made; saved as <run>/federation.json and read back by `start`."""

    run_dir: str
    collaborators: list[str]
    rounds: int
    port: int
    use_tls: bool
    agg_addr: str = AGG_ADDR
    status: str = "prepared"
    prepared_at: str = ""
    setup_seconds: float = 0.0
    aggregator_report_dir: str = ""
    collaborator_report_dir: str = ""
    # What the user allowed off (plan_checks.INSECURE_SETTINGS' values: "tls", "client_auth"); the participants get
    # it in their environment (plan_checks.INSECURE_ENV), and every round says so.
    insecure: list = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return Path(self.run_dir)

    def workspace(self, name: str) -> Path:
        return self.root / name

    def save(self) -> None:
        atomic_write_json(self.root / STATE_FILE, asdict(self))

    @classmethod
    def load(cls, run_dir: Path) -> "FederationLayout":
        path = Path(run_dir) / STATE_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise SetupError(f"{path} not found: {run_dir} is not a prepared federation "
                             "(make one with `python -m workspace prepare --dir ...`)") from None
        except (OSError, ValueError) as err:
            raise SetupError(f"{path}: unreadable ({err})") from None
        data["run_dir"] = str(Path(run_dir).resolve())  # a prepared folder may have been copied
        try:
            layout = cls(**data)
        except TypeError as err:
            raise SetupError(f"{path}: not a federation state file of this tool ({err})") from None
        # The names become folders and `fx` arguments: an edited state file must not name a path outside the folder.
        from src.plan.checks import check_names

        try:
            check_names(f"{path} collaborators", layout.collaborators)
        except ValueError as err:
            raise SetupError(str(err)) from None
        return layout
