"""Writes docs/plan-reference.md: every key of the plan this workspace owns, dotted, with what it takes, its default
and its meaning, generated from the settings declarations themselves (audit.config.fields), so that it cannot drift
from what the plan accepts; tests/test_plan_reference.py checks the committed file is current.

    python -m tools.plan_reference            # (re)writes docs/plan-reference.md
    python -m tools.plan_reference --check    # exit 1 if it is not current

Torch- and OpenFL-free: it reads the declarations, not a built federation.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from audit import reference_rows
from src.server.settings import OPENFL_FILLED, OPENFL_KEYS, AggregatorSettings
from src.data.loader_settings import DataLoaderSettings
from src.plan.checks import TASK_FUNCTIONS
from src.runner.settings import RunnerSettings

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "plan-reference.md"

# (plan section, its template, where its settings are declared, the class)
SECTIONS = (
    ("data_loader.settings", "src.dataloader.AuditDataLoader", "src/data/loader_settings.py", DataLoaderSettings),
    ("task_runner.settings", "src.taskrunner.AuditedTaskRunner",
     "src/runner/settings.py and the classes it names in audit/config/", RunnerSettings),
    ("aggregator.settings", "src.aggregator.AuditingAggregator", "src/server/settings.py", AggregatorSettings),
)

HEADER = """# Plan reference

Every key of the plan (`plan/plan.yaml`) this workspace owns, by its dotted name: what it takes, its default and
what it does. Generated from the settings declarations (`audit/config/fields.py`; audit/config/README.md says how to
declare one) by `python -m tools.plan_reference`; do not edit it by hand (a test checks it is current).

A bad value or an unknown key fails before any work with one line that starts with the dotted key, e.g.
`task_runner.settings.audit.rmia.gamma: expected a finite number > 0, got 0`. OpenFL's own sections (`network`,
`collaborator`, `straggler_handling_policy`, ...) are checked too (`src/plan/openfl_sections.py`) but are OpenFL's to
document.
"""


def _cell(text: str) -> str:
    # a pipe ends a table cell; "<name" would start an HTML tag (and vanish) outside code
    return re.sub(r"<(?=[A-Za-z])", "&lt;", text.replace("|", "\\|"))


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def table(cls, key: str) -> list[str]:
    lines = ["| key | takes | default | meaning |", "|---|---|---|---|"]
    for dotted, takes, default, doc in reference_rows(cls, key):
        lines.append(f"| {_code(dotted)} | {_cell(takes)} | {_cell(_code(default))} | {_cell(doc)} |")
    return lines


def tasks_text() -> list[str]:
    lines = ["## `tasks.<task>.kwargs`", "",
             "The keyword arguments of the task's function (`src/plan/checks.py`); any other is refused, as OpenFL "
             "would pass it on to the function, where it does nothing.", ""]
    for function, checks in TASK_FUNCTIONS.items():
        lines.append(f"- `{function}`: " + "; ".join(f"`{name}`: {_cell(check.describe())}"
                                                     for name, check in checks.items()))
    return lines


def bounds_text() -> list[str]:
    """The counts' bounds (src/plan/bounds.py), from the constants themselves."""
    from audit import MAX_DP_RETRIES, REFERENCE_DISK_SHARE
    from src.plan import bounds

    return [
        "## Counts and their bounds", "",
        "Every count the plan asks for is bounded by what the data, the time and the machine allow, checked before "
        "any work in one line naming the key and the limit (`src/plan/bounds.py`; the demo names its flags):", "",
        f"- `aggregator.settings.rounds_to_train`: at most {bounds.MAX_ROUNDS:,}, and no more than OpenFL's task "
        f"assigner can hold in {bounds.ASSIGNER_MEMORY_SHARE:.3g} of the machine's memory (a list per round for "
        f"each task and collaborator, made at start: about {bounds.ASSIGNER_BYTES_PER_ENTRY} bytes each).",
        "- `data_loader.settings.collaborator_count`: at most the samples of the smallest set "
        "(`floor(samples x ratio)`: each collaborator needs one of each); a local federation (`python -m workspace`) "
        f"also at most one process of ~{bounds.PARTY_PROCESS_BYTES / 2**30:.2f} GB each in the machine's memory.",
        "- `task_runner.settings.audit.sample_size`: at most the dataset's samples.",
        "- The counts that multiply a round's trainings: `tasks.train.kwargs.epochs` and each "
        "`task_runner.settings.per_collaborator.<name>.epochs` (epochs x batches), "
        "`task_runner.settings.audit.rmia.reference_models` (each reference of a trained kind is about one local "
        "training), `task_runner.settings.audit.deanon.shadows_per_user` (one shadow update per crowd user and for "
        "the collaborator, each about one local training), `task_runner.settings.audit.canary.count` (half the "
        "canaries join the shadow training) and `task_runner.settings.gate.dp.max_retries` (each a DP local "
        f"training): each at most {bounds.MAX_ROUND_STEPS:,} optimizer steps a round on the plan's mean shard "
        "(`floor(samples x train_dataset_ratio) / collaborator_count` samples, in batches of "
        "`data_loader.settings.batch_size`). The cheapest step measured, the fcnn on digits at batch 32 on one "
        f"core, takes {bounds.STEP_CPU_MS} CPU-ms (`benchmarks/README.md`, \"Counts and their bounds\"): a round at "
        f"the bound is at least {bounds.CPU_MINUTES_AT_MAX:,.0f} CPU-minutes of one training, far beyond any "
        "federated recipe and far short of what a typo asks for.",
        f"- `task_runner.settings.gate.dp.max_retries`: at most {MAX_DP_RETRIES}: each retry doubles the noise "
        f"multiplier, the last runs at 2^{MAX_DP_RETRIES - 1} times the first's.",
        "- `task_runner.settings.audit.rmia.reference_models`, on the machine: the K references of each trained kind "
        "are kept across rounds (on disk in the temporary folder once they are larger than 32 MB together), and "
        f"must fit in {REFERENCE_DISK_SHARE:.0%} of its free space; checked when the collaborator builds its model.",
        "",
    ]


def generate() -> str:
    lines = [HEADER]
    for key, template, declared_in, cls in SECTIONS:
        lines += [f"## {key}", "", f"`{template}`, declared in {declared_in}.", ""]
        lines += table(cls, key)
        if cls is AggregatorSettings:
            lines += ["", "`callbacks` (a list of `{template: module.Class, settings: {...}}`, "
                          "`openfl.callbacks.Callback` subclasses) is checked where they are built "
                          "(src/aggregator.py). OpenFL's own keys, passed on to its Aggregator: "
                      + ", ".join(f"`{k}`" for k in OPENFL_KEYS) + "; filled in by OpenFL, not by a plan: "
                      + ", ".join(f"`{k}`" for k in OPENFL_FILLED) + "."]
        lines.append("")
    lines += tasks_text()
    lines += ["", *bounds_text()]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if docs/plan-reference.md is not current")
    args = parser.parse_args(argv)
    text = generate()
    if args.check:
        current = REFERENCE.read_text() if REFERENCE.exists() else ""
        if current != text:
            print(f"{REFERENCE.relative_to(ROOT)} is not current: run python -m tools.plan_reference", file=sys.stderr)
            return 1
        return 0
    REFERENCE.parent.mkdir(parents=True, exist_ok=True)
    tmp = REFERENCE.with_suffix(".md.tmp")
    tmp.write_text(text)
    tmp.replace(REFERENCE)
    print(f"wrote {REFERENCE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
