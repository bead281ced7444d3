"""Run a federation of this workspace in one process with OpenFL's real Aggregator and Collaborators.

OpenFL 1.9 has no simulation mode. Each participant gets its own parsed Plan (a Plan caches its runner,
loader and client), the collaborators get a client that calls the aggregator's RPC handlers directly
instead of over gRPC, and each collaborator runs its round's tasks with `Collaborator.do_task`, as
`Collaborator.run()` would. Everything else - task assignment, tensor codecs, aggregation, end of round -
is OpenFL's own code. Used by the demo and the tests; `fx` runs the same plan across processes.
"""

from __future__ import annotations

import copy
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import yaml

logger = logging.getLogger(__name__)

WORKSPACE_ROOT = Path(__file__).resolve().parent.parent


class DirectClient:
    """Stands in for AggregatorGRPCClient: the same calls, answered by the aggregator object itself."""

    def __init__(self, aggregator, collaborator_name: str):
        self.aggregator = aggregator
        self.collaborator_name = collaborator_name
        # Called once, right before the next results go to the aggregator (then forgotten): _run_rounds sets it for
        # a collaborator's last task of a round, whose sending may end the round at the aggregator.
        self.before_next_send: Callable[[], None] | None = None

    def ping(self):
        return True

    def get_tasks(self):
        tasks, round_number, sleep_time, time_to_quit = self.aggregator.get_tasks(self.collaborator_name)
        return tasks or [], round_number, sleep_time, time_to_quit

    def get_aggregated_tensor(self, tensor_name, round_number, report, tags, require_lossless):
        return self.aggregator.get_aggregated_tensor(
            tensor_name, round_number, report, tuple(tags), require_lossless, self.collaborator_name
        )

    def send_local_task_results(self, round_number, task_name, data_size, named_tensors):
        before, self.before_next_send = self.before_next_send, None
        if before is not None:
            before()
        self.aggregator.send_local_task_results(
            self.collaborator_name, round_number, task_name, data_size, named_tensors
        )


def deep_merge(base: dict, overrides: Mapping) -> dict:
    """A copy of `base` with `overrides` merged in, key by key for nested mappings."""
    merged = copy.deepcopy(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), dict):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = copy.deepcopy(value)
    return merged


def collaborator_names(count: int) -> list[str]:
    return [f"collaborator{i}" for i in range(1, count + 1)]


def tensorboard_enabled() -> bool:
    """Env TENSORBOARD as OpenFL's MetricWriter reads it (`bool(int(...))`, which raises on anything but a whole
    number, when the aggregator is built); ValueError naming TENSORBOARD, for a check before any work."""
    text = os.environ.get("TENSORBOARD", "0")
    try:
        return bool(int(text))
    except ValueError:
        raise ValueError(f"TENSORBOARD={text!r}: OpenFL reads it as a whole number; set TENSORBOARD=1 to write "
                         "TensorBoard event files, 0 or unset for none") from None


class PlanFileError(ValueError):
    """A plan file that cannot be read as a plan; the message starts with the file's path."""


def yaml_problem(err: Exception) -> str:
    """A YAML error in one line, " at line L, column C: problem" (PyYAML's own text spans several lines)."""
    mark = getattr(err, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(err, "problem", None) or str(err).splitlines()[0]
    return f"{where}: {problem}"


def read_plan(path: Path) -> dict:
    """The plan file as a mapping; PlanFileError in one line naming the file (and the line of a YAML error)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise PlanFileError(f"{path}: cannot read the plan ({getattr(err, 'strerror', None) or err})") from None
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise PlanFileError(f"{path}: not valid YAML{yaml_problem(err)}") from None
    if not isinstance(config, dict):
        raise PlanFileError(f"{path}: not a plan (a YAML mapping of sections such as task_runner, tasks), got "
                            f"{type(config).__name__}")
    return config


def check_settings(config: Mapping, collaborators: list[str]) -> None:
    """The checks of a run's plan that need neither torch nor OpenFL (the tooling makes them before any folder):
    the aggregator's settings, the tasks, the per-collaborator names and the network, collaborator and
    straggler-policy settings (src.plan.checks). ValueError naming the key."""
    from src.server.settings import AggregatorSettings
    from src.plan.checks import check_plan

    aggregator = config.get("aggregator")
    if not isinstance(aggregator, Mapping) or not isinstance(aggregator.get("settings") or {}, Mapping):
        raise ValueError("aggregator.settings: expected a mapping")
    AggregatorSettings.from_mapping(aggregator.get("settings"))
    check_plan(config, collaborators)


def check_buildable(config: Mapping) -> None:
    """What `fx plan initialize` checks, on the plan in memory: the data loader (without data) and the task runner
    are built, so every setting they validate (each collaborator's too) fails here, naming its key."""
    from openfl.federated import Plan

    if str(WORKSPACE_ROOT) not in sys.path:  # the plan's templates are `src.*` modules of this workspace
        sys.path.insert(0, str(WORKSPACE_ROOT))
    sections = {}
    for name in ("data_loader", "task_runner"):
        section = config.get(name)
        if not isinstance(section, Mapping) or not isinstance(section.get("template"), str) \
                or not isinstance(section.get("settings") or {}, Mapping):
            raise ValueError(f"{name}: expected a mapping with a template and its settings")
        sections[name] = section
    loader = Plan.build(sections["data_loader"]["template"],
                        {**(sections["data_loader"].get("settings") or {}), "data_path": None})
    Plan.build(sections["task_runner"]["template"], {**(sections["task_runner"].get("settings") or {}),
                                                     "data_loader": loader})


def check_party_data(config: Mapping, collaborators: list[str]) -> None:
    """Each party's data, read in this process by the plan's data loader (the readers and the split each collaborator
    uses; collaborator i+1 of the list gets shard i+1), before any certificate or folder: missing or corrupt files,
    a split that leaves a party without samples, and a gate on a tolerance a party's audit population cannot resolve
    (audit.config.per_collaborator.check_gate_resolution) fail here in one line. The loaded dataset stays in the
    loaders' cache for a run in this process (src.dataloader.clear_dataset_cache frees it)."""
    from openfl.federated import Plan

    from audit.config.audit_settings import AuditSettings
    from audit.config.per_collaborator import check_gate_resolution, parse_per_collaborator
    from src.plan.checks import DATA_LOADER_TEMPLATE, TASK_RUNNER_TEMPLATE

    loader_section, runner_section = config.get("data_loader") or {}, config.get("task_runner") or {}
    if loader_section.get("template") != DATA_LOADER_TEMPLATE:
        return  # another loader's data_path means something else
    settings = dict(loader_section.get("settings") or {})
    gates = None
    if runner_section.get("template") == TASK_RUNNER_TEMPLATE:
        runner = runner_section.get("settings") or {}
        audit = AuditSettings.from_mapping(runner.get("audit"), prefix="task_runner.settings.audit")
        gates = (audit, *parse_per_collaborator(runner.get("per_collaborator"), gate=runner.get("gate"),
                                                audit_settings=audit, mitigation=runner.get("mitigation")))
    if str(WORKSPACE_ROOT) not in sys.path:
        sys.path.insert(0, str(WORKSPACE_ROOT))
    for shard, name in enumerate(collaborators, 1):
        loader = Plan.build(DATA_LOADER_TEMPLATE, {**settings, "data_path": str(shard)})
        if gates is not None:
            audit, default, per_collaborator = gates
            population = len(loader.y_population)
            if audit.sample_size is not None:
                population = min(population, audit.sample_size)
            check_gate_resolution(name, default, per_collaborator, audit, population)


def check_run_plan(config: Mapping, collaborators: list[str]) -> None:
    """Every check a run's plan gets before anything is written: check_settings, check_buildable, then each
    party's data (check_party_data)."""
    check_settings(config, collaborators)
    check_buildable(config)
    check_party_data(config, collaborators)


def run_plan_config(run_dir: Path, *, collaborators: int, rounds: int, overrides: Mapping | None = None,
                    plan_path: Path | None = None) -> dict:
    """The workspace plan with this run's paths and the overrides (see write_run_plan); nothing is written."""
    if collaborators < 1:
        raise ValueError(f"collaborators: need at least 1, got {collaborators}")
    if rounds < 1:
        raise ValueError(f"rounds: need at least 1, got {rounds}")
    run_dir = Path(run_dir).resolve()
    config = read_plan(Path(plan_path or WORKSPACE_ROOT / "plan" / "plan.yaml"))
    run_settings = {
        "aggregator": {"settings": {
            "rounds_to_train": rounds,
            "init_state_path": str(run_dir / "save" / "init.pbuf"),
            "best_state_path": str(run_dir / "save" / "best.pbuf"),
            "last_state_path": str(run_dir / "save" / "last.pbuf"),
            "persist_checkpoint": False,
            "write_logs": False,  # OpenFL's writer would write to ./logs: run_in_process gives its own, run_dir/logs
            "report_dir": str(run_dir / "aggregator_report"),
        }},
        "collaborator": {"settings": {"write_logs": False}},
        "data_loader": {"settings": {"collaborator_count": collaborators}},
        "task_runner": {"settings": {"audit": {"report_dir": str(run_dir / "reports")}}},
    }
    return deep_merge(deep_merge(config, run_settings), overrides or {})


def write_run_plan(run_dir: Path, *, collaborators: int, rounds: int, overrides: Mapping | None = None,
                   plan_path: Path | None = None) -> Path:
    """Write the workspace plan, with overrides and this run's paths, into run_dir/plan; returns that folder.

    The aggregator's state files go to run_dir/save, the collaborators' reports to run_dir/reports and the
    aggregator's report to run_dir/aggregator_report (not inside run_dir/reports, whose index lists the parties
    the audit reports are about) unless the overrides say otherwise; no checkpoint database is kept, so a new
    run never resumes an old one.
    """
    config = run_plan_config(run_dir, collaborators=collaborators, rounds=rounds, overrides=overrides,
                             plan_path=plan_path)
    run_dir = Path(run_dir).resolve()
    plan_dir = run_dir / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "save").mkdir(exist_ok=True)
    (plan_dir / "plan.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    names = collaborator_names(collaborators)
    (plan_dir / "cols.yaml").write_text(yaml.safe_dump({"collaborators": names}))
    (plan_dir / "data.yaml").write_text("".join(f"{name},{i}\n" for i, name in enumerate(names, 1)))
    return plan_dir


def parse_plan(plan_dir: Path):
    from openfl.federated import Plan

    if str(WORKSPACE_ROOT) not in sys.path:  # the plan's templates are `src.*` modules of this workspace
        sys.path.insert(0, str(WORKSPACE_ROOT))
    return Plan.parse(plan_dir / "plan.yaml", cols_config_path=plan_dir / "cols.yaml",
                      data_config_path=plan_dir / "data.yaml")


def initial_tensor_dict(plan) -> dict:
    """The initial global model, built the way `fx plan initialize` builds save/init.pbuf."""
    from openfl.utilities.dataloading import initialize_minimal_dataloader
    from openfl.utilities.split import split_tensor_dict_for_holdouts

    runner = plan.get_task_runner(initialize_minimal_dataloader(plan))
    tensor_dict, _holdout = split_tensor_dict_for_holdouts(
        runner.get_tensor_dict(False), **runner.tensor_dict_split_fn_kwargs
    )
    plan.runner_ = None  # the plan caches its runner: a model and an optimizer nobody uses after this
    return tensor_dict


@dataclass
class FederationResult:
    """What an in-process run produced."""

    plan_dir: Path
    report_dir: Path
    aggregator_report_dir: Path | None  # None if the plan's aggregator is not src.aggregator.AuditingAggregator
    aggregator: object
    collaborators: dict
    round_logs: list[dict] = field(default_factory=list)      # aggregator's averaged metrics per round
    collaborator_metrics: list[dict] = field(default_factory=list)  # per round: {"col/task/metric": value}

    def runner(self, name: str):
        return self.collaborators[name].task_runner

    def global_weights(self, round_num: int) -> dict:
        """The global model the parties receive at the start of `round_num` (= rounds: the final model).

        Read from the aggregator's tensor store: OpenFL's `last_tensor_dict` holds the model a round started
        from, one round behind the newly aggregated one. The store keeps the last `db_store_rounds` rounds.
        """
        tensors = self.aggregator.tensor_db.get_tensors_by_round_and_tags(round_num, ("model",))
        if not tensors:
            raise KeyError(f"no global model for round {round_num} in the aggregator's tensor store")
        return {key.tensor_name: value for key, value in tensors.items()}


def run_in_process(run_dir: Path, *, collaborators: int = 2, rounds: int = 3, overrides: Mapping | None = None,
                   on_round_end: Callable[[int, dict], None] | None = None,
                   on_task: Callable[[str, str, int], None] | None = None,
                   on_audit_start: Callable[[str, int], None] | None = None,
                   check: bool = True, plan_path: Path | None = None) -> FederationResult:
    """Run the whole federation; `on_task(collaborator, task, round)` is called before each task and
    `on_audit_start(collaborator, round)` when a collaborator's audit starts (inside its train task).
    The plan (`plan_path`, default the workspace's) is checked (check_run_plan) before anything is written, unless
    the caller did (`check=False`)."""
    from openfl.callbacks import LambdaCallback

    from audit.reporting.background import flush as flush_reports
    from src.process.metric_writer import PartyMetricWriter

    tensorboard_enabled()  # fails here, not inside OpenFL's MetricWriter
    if check:
        check_run_plan(run_plan_config(run_dir, collaborators=collaborators, rounds=rounds, overrides=overrides,
                                       plan_path=plan_path), collaborator_names(collaborators))
    plan_dir = write_run_plan(Path(run_dir), collaborators=collaborators, rounds=rounds, overrides=overrides,
                              plan_path=plan_path)
    agg_plan = parse_plan(plan_dir)
    report_dir = Path(agg_plan.config["task_runner"]["settings"]["audit"]["report_dir"])

    round_logs: list[dict] = []

    def record_round(round_num, logs=None):
        round_logs.append(dict(logs or {}))
        if on_round_end is not None:
            on_round_end(round_num, dict(logs or {}))

    # Callback objects go in next to the plan's {template, settings} entries; AuditingAggregator (the plan's
    # template) hands OpenFL a fresh list, so nothing leaks into OpenFL's shared default `callbacks=[]`.
    agg_settings = agg_plan.config["aggregator"]["settings"]
    # Every participant writes what `fx` runs write with the plan's write_logs (src.process.metric_writer: per round
    # <name>_metrics.txt, and TensorBoard event files in <name>_tensorboard/ when TENSORBOARD=1), here under
    # run_dir/logs instead of each party's ./logs.
    logs_dir = str(Path(run_dir).resolve() / "logs")
    agg_settings["callbacks"] = [*(agg_settings.get("callbacks") or []), LambdaCallback(on_round_end=record_round),
                                 PartyMetricWriter(log_dir=logs_dir)]
    aggregator = agg_plan.get_aggregator(tensor_dict=initial_tensor_dict(agg_plan))

    cols, clients = {}, {}
    for name in collaborator_names(collaborators):
        plan = parse_plan(plan_dir)
        writer = PartyMetricWriter(log_dir=logs_dir)
        plan.config["collaborator"]["settings"]["callbacks"] = [writer]
        clients[name] = DirectClient(aggregator, name)
        cols[name] = plan.get_collaborator(name, client=clients[name])
        writer.record_source = cols[name].task_runner  # the bounds of its audit's figures (its own TensorBoard run)
        if on_audit_start is not None:
            cols[name].task_runner.audit.on_audit_start = on_audit_start
        cols[name].callbacks.on_experiment_begin()  # as Collaborator.run() does

    collaborator_metrics: list[dict] = []
    try:
        _run_rounds(aggregator, cols, clients, on_task, collaborator_metrics)
    finally:
        # The collaborators' plots and pages are drawn by the process's report worker: all there when this returns.
        flush_reports()

    return FederationResult(plan_dir=plan_dir, report_dir=report_dir,
                            aggregator_report_dir=getattr(aggregator, "report_dir", None),
                            aggregator=aggregator, collaborators=cols,
                            round_logs=round_logs, collaborator_metrics=collaborator_metrics)


#: TensorDB tags of a collaborator's model tensors (received, trained): what drop_finished_models frees.
MODEL_TAGS = ("model", "trained")


def drop_finished_models(col, round_num: int) -> int:
    """Free the model tensors (received and trained, each a model's size) of `col`'s rounds up to `round_num`, once
    its round is over; returns how many rows went. OpenFL's own clean-up (`db_store_rounds`, 2 in our plan) keeps
    the last rounds' models for a collaborator process of its own; in one process every collaborator's copies add up
    (3 models per collaborator per round kept), and no later task reads them: the next round's model comes from the
    aggregator. Not with delta updates (`use_delta_updates`): the collaborator then applies the aggregator's
    deltas to the model it holds, so nothing is dropped. Metric rows stay."""
    if getattr(col, "use_delta_updates", False):
        return 0
    db = col.tensor_db
    with db.mutex:
        frame = db.tensor_db
        finished = frame["round"].astype(int) <= round_num
        model_rows = frame["tags"].map(lambda tags: any(tag in MODEL_TAGS for tag in tags))
        drop = finished & model_rows & ~frame["report"].astype(bool)
        db.tensor_db = frame[~drop].reset_index(drop=True)
    return int(drop.sum())


def _run_rounds(aggregator, cols: dict, clients: dict, on_task, collaborator_metrics: list[dict]) -> None:
    """Every round's tasks, collaborator by collaborator, as Collaborator.run() would, then the quit signals."""
    while not aggregator._time_to_quit():
        round_num = aggregator.round_number
        metrics: dict = {}
        for name, col in cols.items():
            tasks, task_round, _sleep, quit_now = clients[name].get_tasks()
            if quit_now:
                break
            # The callbacks of Collaborator.run(): a round's logs are the metrics its tasks reported.
            col.callbacks.on_round_begin(task_round)
            logs: dict = {}
            for index, task in enumerate(tasks):
                if on_task is not None:
                    on_task(name, task if isinstance(task, str) else task.name, task_round)
                if index == len(tasks) - 1:
                    # The last task's results (a model's size of sending) may end the round at the aggregator, its
                    # memory peak (aggregation, the model's save): this collaborator's models of the round are
                    # done with by then (its last task computed its results), so they go first.
                    clients[name].before_next_send = lambda col=col, r=task_round: drop_finished_models(col, r)
                logs.update(col.do_task(task, task_round))
            clients[name].before_next_send = None  # a task that sent nothing
            col.tensor_db.clean_up(col.db_store_rounds)
            drop_finished_models(col, task_round)
            col.callbacks.on_round_end(task_round, logs)
            metrics.update(logs)
        if aggregator.round_number == round_num:
            raise RuntimeError(f"round {round_num} did not complete: a collaborator got no tasks")
        collaborator_metrics.append(metrics)
    for name in cols:  # let every collaborator receive its quit signal, as after a real run
        clients[name].get_tasks()
        cols[name].callbacks.on_experiment_end()
