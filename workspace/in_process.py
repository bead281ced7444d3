"""Run a federation of this workspace in one process with OpenFL's real Aggregator and Collaborators.

OpenFL 1.9 has no simulation mode. Each participant gets its own parsed Plan (a Plan caches its runner,
loader and client), the collaborators get a client that calls the aggregator's RPC handlers directly
instead of over gRPC, and each collaborator runs its round's tasks with `Collaborator.do_task`, as
`Collaborator.run()` would. Everything else - task assignment, tensor codecs, aggregation, end of round -
is OpenFL's own code. Used by the demo and the tests; `fx` runs the same plan across processes. The run's plan
file and its checks are workspace.plan_file's.
"""

from __future__ import annotations

import gc
import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from workspace.plan_file import WORKSPACE_ROOT, check_run_plan, collaborator_names, run_plan_config, write_run_plan
from workspace.shared_global_model import shared_global_tensor

logger = logging.getLogger(__name__)


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
        shared = shared_global_tensor(self.aggregator, self.collaborator_name, tensor_name, round_number, report,
                                      tuple(tags), require_lossless)  # the aggregator's own array where it can be
        if shared is not None:
            return shared
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


def tensorboard_enabled() -> bool:
    """Env TENSORBOARD as OpenFL's MetricWriter reads it (`bool(int(...))`, which raises on anything but a whole
    number, when the aggregator is built); ValueError naming TENSORBOARD, for a check before any work."""
    text = os.environ.get("TENSORBOARD", "0")
    try:
        return bool(int(text))
    except ValueError:
        raise ValueError(f"TENSORBOARD={text!r}: OpenFL reads it as a whole number; set TENSORBOARD=1 to write "
                         "TensorBoard event files, 0 or unset for none") from None


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
    # ... and a runner is reference cycles (its audit's callbacks, OpenFL's): freed now, not at the next collection
    # of the oldest generation, which a process holding a model's millions of objects may run rounds later.
    del runner
    gc.collect()
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
    # The round after the last, when the plan has it (src/server/final_round.py): every collaborator's audit of the
    # final model. The aggregator's averages and each collaborator's scalars of it; None: no such round.
    final_logs: dict | None = None
    final_metrics: dict | None = None

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

    from audit import FAILED, FINISHED, INTERRUPTED, flush_reports, write_run_file
    from src.plan.paths import allowing, owner_allowance
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
    final_logs: list[dict] = []
    rounds_written: list[Path] = []  # the report folder, once run.json is written

    def record_round(round_num, logs=None):
        if round_num == getattr(aggregator, "final_round", None):  # the final model's audit: no training round
            final_logs.append(dict(logs or {}))
            return
        round_logs.append(dict(logs or {}))
        for folder in rounds_written:  # the round's reports are written: run.json counts it
            write_run_file(folder, update=lambda info: info.round_written(round_num + 1))
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
    # OpenFL's Plan.get_aggregator leaves the initial model in the plan's settings, which this run's plan object keeps
    # to the end: a whole model (89 MB for the tutorial's net) after the aggregator's store has dropped round 0.
    agg_settings.pop("initial_tensor_dict", None)

    cols, clients = {}, {}
    for name in collaborator_names(collaborators):
        plan = parse_plan(plan_dir)
        writer = PartyMetricWriter(log_dir=logs_dir)
        plan.config["collaborator"]["settings"]["callbacks"] = [writer]
        clients[name] = DirectClient(aggregator, name)
        # This process's caller owns every party and wrote the plan: the absolute paths it names are its own choice
        # on its own disk (src.plan.paths); a relative one still stays in the run's folder.
        with allowing(owner_allowance(plan.config)):
            cols[name] = plan.get_collaborator(name, client=clients[name])
        writer.record_source = cols[name].task_runner  # the bounds of its audit's figures (its own TensorBoard run)
        if on_audit_start is not None:
            cols[name].task_runner.audit.on_audit_start = on_audit_start
        cols[name].callbacks.on_experiment_begin()  # as Collaborator.run() does

    collaborator_metrics: list[dict] = []
    write_run_file(report_dir, info=run_info(plan_dir, collaborator_names(collaborators), rounds, aggregator))
    rounds_written[:] = [report_dir]  # from here on each round's end is recorded in run.json
    try:
        _run_rounds(aggregator, cols, clients, on_task, collaborator_metrics)
    except KeyboardInterrupt as stop:
        # An interrupt stops the drawing too (the caller: audit.reporting.background.cancel), not waits for it: only
        # the run's record says how it ended (the caller may say more, and draws the run index).
        _record_end(report_dir, INTERRUPTED, str(stop) or "SIGINT")  # a plain KeyboardInterrupt: Python's SIGINT
        raise
    except BaseException as err:
        try:  # the rounds done get their pages, and the run's record says the run ended early
            flush_reports()
            _record_end(report_dir, FAILED, f"{type(err).__name__}: {err}"[:300])
            _draw_index(report_dir)
        except OSError:  # a disk fault: the error being raised says so
            pass
        raise
    # The collaborators' plots and pages are drawn by the process's report worker: all there when this returns.
    flush_reports()
    _record_end(report_dir, FINISHED)
    _draw_index(report_dir)
    final = getattr(aggregator, "final_round", None)
    final_metrics = collaborator_metrics.pop() if final is not None and len(collaborator_metrics) > final else None

    return FederationResult(plan_dir=plan_dir, report_dir=report_dir,
                            aggregator_report_dir=getattr(aggregator, "report_dir", None),
                            aggregator=aggregator, collaborators=cols,
                            round_logs=round_logs, collaborator_metrics=collaborator_metrics,
                            final_logs=final_logs[0] if final_logs else None, final_metrics=final_metrics)


def _record_end(report_dir: Path, state: str, reason: str | None = None) -> None:
    """run.json says how the run ended (audit.run_states), keeping the rounds written."""
    from audit import write_run_file

    try:
        write_run_file(report_dir, update=lambda info: info.ended(state, reason))
    except OSError:
        if state == FINISHED:
            raise
        # a run that ends early on a disk fault: the error being raised names it


def _draw_index(report_dir: Path) -> None:
    """The run index that shows how the run ended, drawn by the report worker, waited for."""
    from audit import flush_reports, redraw_index

    redraw_index(report_dir)
    flush_reports()


def run_info(plan_dir: Path, names: list[str], rounds: int, aggregator):
    """The run's record's run-level part as the run starts (audit.run_record.RunInfo, running, no round
    written): the planned rounds, the collaborators, the plan file and whether the final model is audited, and the
    versions."""
    import importlib.metadata

    from audit import RUNNING, RunInfo, library_versions

    settings = {"rounds": rounds, "collaborators": list(names), "plan": str(Path(plan_dir) / "plan.yaml"),
                "final_model_audit": getattr(aggregator, "final_round", None) is not None}
    versions = library_versions({"openfl": importlib.metadata.version("openfl")})
    return RunInfo(RUNNING, rounds, settings, versions)


def _run_rounds(aggregator, cols: dict, clients: dict, on_task, collaborator_metrics: list[dict]) -> None:
    """Every round's tasks, collaborator by collaborator, as Collaborator.run() would, then the quit signals."""
    from src.collaborator import drop_finished_models
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
            col.callbacks.on_round_end(task_round, logs)  # the plan's collaborator drops the round's models here
            metrics.update(logs)
        if aggregator.round_number == round_num:
            raise RuntimeError(f"round {round_num} did not complete: a collaborator got no tasks")
        collaborator_metrics.append(metrics)
    for name in cols:  # let every collaborator receive its quit signal, as after a real run
        clients[name].get_tasks()
        cols[name].callbacks.on_experiment_end()
