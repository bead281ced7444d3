"""The aggregator OpenFL loads (`aggregator.template: src.aggregator.AuditingAggregator`).

OpenFL's `Aggregator` plus what this workspace needs on the server side:

- `aggregator.settings.poll_interval_s` (default 1): how long the request of a collaborator with nothing to do is
  held open. OpenFL answers such a request at once with "sleep 10 s", which cost up to 10 s of idling per round (up
  to poll_interval_s with a plain rewrite of that answer: half the latency of a digits round). Here the request
  waits for the round's end and is answered with the next round's tasks as soon as the round ends; after
  poll_interval_s without one it is answered "ask again now" (sleep 0), so an idle collaborator still asks once per
  poll_interval_s (see `get_tasks`).
- the gRPC server listens on `network.settings.agg_addr` only, not on every interface (src/server/grpc_server.py).
- aggregator-side audit callbacks: the report below, plus any listed in `aggregator.settings.callbacks`
  (`[{template: module.Class, settings: {...}}]`) or passed as objects (in-process runs).
- `aggregator.settings.report_dir` (default reports/aggregator): the aggregator's report, per round which
  collaborators' updates were averaged, withheld or left out and why, and the averaged audit metrics
  (audit/aggregator_report/writer.py).
- `aggregator.settings.deanon` (default `enabled: false`): the aggregator-side deanonymization audit, the paper's
  honest-but-curious server attacking the real updates; writes `<report_dir>/deanon/` (src/server/deanon_callback.py).
- `aggregator.settings.save_every_round` (default false): OpenFL writes the model files (`last_state_path`,
  `best_state_path`) at every round's end; here the last model's only at the last round and the best model's when
  it improves, unless this is true.
- `aggregator.settings.canary_clients` (default `enabled: false`): Andrew et al.'s canary clients for parties that
  send dp_fedavg updates (audit/canary/clients.py): a user-level epsilon estimate of the global model per round, on
  the aggregator's page beside the accountant's.
- `aggregator.settings.final_model_audit` (default true): one round after `rounds_to_train` whose only task is the
  plan's `final_model_audit`: every collaborator audits the final global model against its own members
  (src/server/final_round.py). That round trains nothing; the aggregator's report and callbacks leave it out, and
  its model file (`last_state_path`) is the final model.

Bad values fail when the aggregator is built (`fx aggregator start`), naming the key: its own settings, an
`aggregator.settings` key OpenFL's Aggregator does not take, the plan's `tasks`, `per_collaborator` names that are
no authorized collaborator, the network, collaborator, straggler-policy and assigner settings, a `defaults:` file
OpenFL does not ship and an unsafe collaborator name (src.plan.checks). A plan with `network.settings.use_tls` or
`require_client_auth` false is refused unless FEDERATION_INSECURE allows it (src.plan.checks.check_transport); the
aggregator then logs a warning every round.
"""

from __future__ import annotations

import importlib
import logging
import queue
import threading
from typing import Any, Iterable

from openfl.callbacks import Callback, MetricWriter
from openfl.component import Aggregator
from openfl.protocols import utils
from openfl.utilities import TensorKey

from src.server import grpc_server as aggregator_server, model_file
from src.server.final_round import FinalRound
from src.process.cuda_pages import release_cuda_library_pages
from src.aggregation import round_decisions
from audit import AggregatorReportWriter, aggregator_round, metrics_from_tensor_db, withheld_warning
from src.server.settings import DEFAULT_POLL_INTERVAL_S, DEFAULT_REPORT_DIR, PREFIX, AggregatorSettings
from src.server.tensordb import IndexedTensorDB
from src.process.metric_writer import PartyMetricWriter
from src.process.party_events import emit
from src.plan.checks import check_built_plan, check_tasks, check_transport, plan_being_built

AGGREGATOR_PARTY = "aggregator"  # the name its status events carry (src.process.party_events)
logger = logging.getLogger(__name__)

# OpenFL's gRPC server serves requests on 8 worker threads (openfl.transport.grpc.common.create_grpc_server): at most
# this many idle collaborators' requests are held open at once, so that results and model downloads always find a
# free thread; further idle requests get OpenFL's usual answer, "sleep poll_interval_s".
MAX_HELD_REQUESTS = 4


class AggregatorReportCallback(Callback):
    """Writes the aggregator's report at the end of every round (after aggregation, before the TensorDB is cleaned)."""

    def __init__(self, report_dir):
        super().__init__()
        self.writer = AggregatorReportWriter(report_dir)
        self.aggregator = None
        self.canary_clients = None  # audit.canary.clients.CanaryClients, when aggregator.settings.canary_clients asks
        self.errors: list[str] = []

    def set_aggregator(self, aggregator) -> None:
        self.aggregator = aggregator

    def on_round_end(self, round_num: int, logs=None):
        # on_round_end runs inside Aggregator._end_of_round_check, after the round is marked done and before the
        # round number moves on: an exception here would leave the whole federation stuck in this round. A report
        # that cannot be written is logged loudly (and kept in self.errors); the training goes on.
        if is_final_round(self.aggregator, round_num):  # no update was sent: the parties' reports hold the audit
            logger.info("The final model was audited by every collaborator: %s", logs)
            return
        try:
            agg = self.aggregator
            frame = self.tensor_db.tensor_db
            record = aggregator_round(
                round_num,
                authorized=agg.authorized_cols,
                stragglers=agg.stragglers,
                metrics=metrics_from_tensor_db(frame, round_num, agg.authorized_cols),
                # the decisions GatedWeightedAverage made, from the same rows
                decisions=round_decisions(frame.to_dict("records"), round_num, agg.authorized_cols),
                aggregator_logs=logs,
                canary_clients=None if self.canary_clients is None else self.canary_clients.estimate(round_num),
            )
            path = self.writer.write_round_in_background(record)
            logger.info("Round %d aggregator report: averaged %s, withheld %s, left out (NaN/Inf) %s, "
                        "stragglers %s -> %s", round_num, record["kept"], record["withheld"],
                        record["left_out_non_finite"], record["stragglers"], path)
        except Exception as err:  # noqa: BLE001 - see above
            self.errors.append(f"round {round_num}: {err!r}")
            logger.exception("Round %d: could not write the aggregator report under %s", round_num, self.writer.root)

    def on_experiment_end(self, logs=None):
        # The summaries are drawn by the report worker (write_round_in_background): the last round's are on disk
        # before the collaborators get their quit signals.
        from audit import flush_reports

        flush_reports()
        warning = withheld_warning(self.writer.load_rounds())
        if warning:
            logger.warning("Warning: %s", warning)


def is_final_round(aggregator, round_num: int) -> bool:
    """Whether `round_num` is the round after the last, in which the collaborators audit the final model."""
    return getattr(aggregator, "final_round", None) == round_num


def _canary_clients(settings, plan):
    """audit.canary.clients.CanaryClients for the plan's dp_fedavg mitigation (one for every party: its clipping bound
    and noise multiplier are the canaries' and the accountant's), the audit's delta and confidence."""
    from audit import AuditSettings, CanaryClients, Mitigation, parse

    key = f"{PREFIX}.canary_clients"
    if plan is None:
        raise ValueError(f"{key}: reads the parties' dp_fedavg settings from the plan; build the aggregator from a "
                         "plan (fx aggregator start, python -m workspace)")
    runner = ((plan.get("task_runner") or {}).get("settings") or {})
    mitigation = parse(Mitigation, runner.get("mitigation"), "task_runner.settings.mitigation")
    if mitigation.method != "dp_fedavg":
        raise ValueError(f"{key}: estimates the privacy of dp_fedavg updates; task_runner.settings.mitigation.method "
                         f"is {mitigation.method!r}")
    for name, entry in (runner.get("per_collaborator") or {}).items():
        if isinstance(entry, dict) and "mitigation" in entry \
                and parse(Mitigation, entry["mitigation"], f"task_runner.settings.per_collaborator.{name}.mitigation") \
                != mitigation:
            raise ValueError(f"{key}: every party must send dp_fedavg updates with the plan's clip and sigma; "
                             f"task_runner.settings.per_collaborator.{name}.mitigation differs")
    audit = AuditSettings.from_mapping(runner.get("audit"), prefix="task_runner.settings.audit")
    return CanaryClients(count=settings.count, scale=settings.scale, clip=mitigation.clip, sigma=mitigation.sigma,
                         seed=settings.seed, delta=audit.epsilon_delta, confidence=audit.confidence)


def build_callbacks(entries: Any) -> list:
    """Callback objects from `aggregator.settings.callbacks`: Callback objects or {template, settings} mappings."""
    if entries is None:
        return []
    if not isinstance(entries, (list, tuple)):
        raise ValueError(f"{PREFIX}.callbacks: expected a list of {{template: module.Class, settings: {{...}}}}, "
                         f"got {entries!r}")
    built = []
    for i, entry in enumerate(entries):
        where = f"{PREFIX}.callbacks[{i}]"
        if isinstance(entry, Callback):
            built.append(entry)
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("template"), str):
            raise ValueError(f"{where}: expected {{template: module.Class, settings: {{...}}}} or a Callback, "
                             f"got {entry!r}")
        unknown = set(entry) - {"template", "settings"}
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: template, settings)")
        settings = entry.get("settings") or {}
        if not isinstance(settings, dict):
            raise ValueError(f"{where}.settings: expected a mapping, got {settings!r}")
        module_name, _, class_name = entry["template"].rpartition(".")
        try:
            cls = getattr(importlib.import_module(module_name), class_name)
        except (ImportError, AttributeError, ValueError) as err:
            raise ValueError(f"{where}.template: cannot import {entry['template']!r}: {err}") from None
        callback = cls(**settings)
        if not isinstance(callback, Callback):
            raise ValueError(f"{where}.template: {entry['template']} is not an openfl.callbacks.Callback")
        built.append(callback)
    return built


class UnreadQueue(queue.Queue):
    """OpenFL's metric_queue, with nothing kept: the same calls, and nothing in it (no one reads it)."""

    def _put(self, item) -> None:
        pass


class AuditingAggregator(Aggregator):
    """OpenFL's Aggregator with a plan-set poll interval, a bound gRPC server and aggregator-side audit callbacks."""

    def __init__(self, *, poll_interval_s: int = DEFAULT_POLL_INTERVAL_S, report_dir: str = DEFAULT_REPORT_DIR,
                 deanon: dict | None = None, callbacks: Iterable | None = None, save_every_round: bool = False,
                 canary_clients: dict | None = None, final_model_audit: bool = True, **kwargs):
        # OpenFL has loaded torch: without a GPU its CUDA libraries' pages are dead weight (before the initial model
        # and the TensorDB are loaded, the process's peak otherwise).
        release_cuda_library_pages()
        # Every key of aggregator.settings arrives here (OpenFL's among the kwargs): an unknown one is named, not a
        # TypeError from Aggregator.__init__.
        settings = AggregatorSettings.from_mapping({**kwargs, "poll_interval_s": poll_interval_s,
                                                    "report_dir": report_dir, "deanon": deanon,
                                                    "save_every_round": save_every_round,
                                                    "canary_clients": canary_clients,
                                                    "final_model_audit": final_model_audit})
        # The plan's tasks reach the collaborators' task functions only in round 0: check them before anyone connects.
        if getattr(kwargs.get("assigner"), "tasks", None) is not None:
            check_tasks(kwargs["assigner"].tasks)
        # The whole plan, where OpenFL's Plan builds us (`fx aggregator start`): the collaborators' names are known
        # here (plan/cols.yaml), so a `per_collaborator` name that is none of them fails now, as do the network,
        # collaborator and straggler-policy settings, a missing `defaults:` file and an unsafe collaborator name; and
        # a plan that turns TLS or client authentication off, unless the operator allowed it (plan_checks.INSECURE_ENV).
        built = plan_being_built()
        self.insecure: list[str] = []
        # Whether the plan's collaborators ask for delta updates (OpenFL's default: no); None: built without a plan,
        # unknown, so every copy of the next model is kept.
        self._collaborators_use_deltas = None if built is None else bool(
            ((built.config.get("collaborator") or {}).get("settings") or {}).get("use_delta_updates", False))
        if built is not None:
            check_built_plan(built, list(kwargs.get("authorized_cols") or []))
            self.insecure = check_transport(built.config)
        clients = (_canary_clients(settings.canary_clients, None if built is None else built.config)
                   if settings.canary_clients.enabled else None)
        # The round after the last (src/server/final_round.py): counted in from the start, so that OpenFL's per-round
        # bookkeeping holds it. Not in OpenFL's evaluation mode (one round, no training: no final model).
        assigner = kwargs.get("assigner")
        self.final_round = None
        if settings.final_model_audit and assigner is not None and not assigner.is_task_group_evaluation():
            kwargs["assigner"] = FinalRound(assigner)
            self.final_round = kwargs["assigner"].final_round
            kwargs["rounds_to_train"] = self.final_round + 1
        self.poll_interval_s = settings.poll_interval_s
        self.save_every_round = settings.save_every_round
        self._best_round: int | None = None  # the round of the best model so far (its file: best_state_path)
        self.report = AggregatorReportCallback(settings.report_dir)
        self.deanon = None  # the DeanonymizationCallback, if aggregator.settings.deanon.enabled
        own = [self.report]
        if settings.deanon.enabled:
            # Imported only when enabled: the audit brings torch and scikit-learn into the aggregator process.
            from src.server.deanon_callback import DeanonymizationCallback

            options = settings.deanon.to_dict()
            options.pop("enabled")
            self.deanon = DeanonymizationCallback(settings.report_dir, **options)
            own.append(self.deanon)
        own += build_callbacks(callbacks)
        if kwargs.get("write_logs") and not any(isinstance(c, MetricWriter) for c in own):
            own.append(PartyMetricWriter())  # in place of OpenFL's: TensorBoard tags named by metric
        for callback in own:
            if hasattr(callback, "set_aggregator"):
                callback.set_aggregator(self)
        # Held get_tasks requests wait on this until a round ends (get_tasks, _end_of_round_check).
        self._round_ended = threading.Condition()
        self._held_requests = 0
        # Always a fresh list: Aggregator.__init__ appends its own callbacks to the list it gets, and its default
        # (`callbacks=[]`) is one list shared by every Aggregator built without callbacks.
        super().__init__(callbacks=list(own), **kwargs)
        # OpenFL's pandas TensorDB was most of the end of a round (src/server/tensordb.py): the same rows and
        # answers, indexed. Converted in place: the callbacks already hold this object.
        IndexedTensorDB.convert(self.tensor_db)
        # OpenFL 1.9 puts every metric of every round into metric_queue, and nothing of OpenFL or of this workspace
        # reads it (OpenFL marks it for deprecation): a dict a metric that the aggregator held for the whole run.
        self.metric_queue = UnreadQueue()
        self._attach_canary_clients(clients)
        self._tensor_names = list(utils.deconstruct_model_proto(self.model, self.compression_pipeline,
                                                                keys_only=True)[0])
        if not self.persistent_db:
            # OpenFL keeps the initial model's whole protobuf (a model's size: 89 MB for the tutorial's net) for the
            # run; after loading it into the tensor store it reads it only in its own _save_model, for the tensors'
            # names, which are read above. Where OpenFL's save runs (persist_checkpoint), it stays.
            self.model = None
        aggregator_server.install()
        self._warn_insecure()  # round 0's; each later round's when the round before it ends

    @property
    def report_dir(self):
        return self.report.writer.root

    def _attach_canary_clients(self, clients) -> None:
        """The canary clients (None: none) go into every task's GatedWeightedAverage (the train task's); the report
        reads them. Set every time: OpenFL's aggregation functions are one object per class and process
        (SingletonABCMeta), so an earlier aggregator's canary clients would stay in an in-process run's average."""
        from src.aggregation import GatedWeightedAverage

        functions = [self.assigner.get_aggregation_type_for_task(task) for task in self.assigner.tasks]
        gated = [f for f in functions if isinstance(f, GatedWeightedAverage)]
        if clients is not None and not gated:
            raise ValueError(f"{PREFIX}.canary_clients: needs the train task's aggregation_type "
                             "src.aggregation.GatedWeightedAverage (tasks.train.aggregation_type), which adds them")
        for function in gated:
            function.canary_clients = clients
        self.report.canary_clients = clients

    def _save_model(self, round_number, file_path):
        """OpenFL's model files (best_state_path, last_state_path): each round only with `save_every_round`; else the
        last model's file at the last round, and the best model's when it improves. Each file is the protobuf of the
        whole model, which nothing in a run reads; OpenFL also deserialised the previous file's whole protobuf for
        the tensors' names (read once here). No round's tensors are held beyond the tensor store's own rows: OpenFL
        keeps the last and the best round's in memory (last_tensor_dict, best_tensor_dict), each a whole model of its
        own once the store's clean-up drops that round, through every later round's training and audit. Here
        last_tensor_dict is set at the last round only, and best_tensor_dict is read back from its file when asked
        for (at the last round, when it was the best, that round's dict). The recovery database
        (persist_checkpoint) is OpenFL's own: with it every save is OpenFL's."""
        if self.persistent_db:
            super()._save_model(round_number, file_path)
            return
        tensor_dict = {}
        for name in self._tensor_names:
            value = self.tensor_db.get_tensor_from_cache(TensorKey(name, self.uuid, round_number, False, ("model",)))
            if value is None:  # as OpenFL: nothing to save for this round
                logger.info("Cannot save model for round %s. Continuing...", round_number)
                return
            tensor_dict[name] = value
        best = file_path == self.best_state_path
        final = round_number >= self.rounds_to_train - 1
        if best:
            self._best_round = round_number
        if file_path == self.last_state_path:
            if final:
                self.last_tensor_dict = tensor_dict
            else:
                self.__dict__.pop("last_tensor_dict", None)
            if final and self._best_round == round_number:
                self._best_tensor_dict = tensor_dict  # one dict for both, as OpenFL's
            else:
                self.__dict__.pop("_best_tensor_dict", None)  # its file holds it
        if best or self.save_every_round or final:
            self._write_model(tensor_dict, round_number, file_path)

    @property
    def best_tensor_dict(self) -> dict:
        """The best round's tensors (OpenFL's attribute): the last round's dict when that round was the best, else
        read from the best model's file (each time: nothing holds them in between)."""
        held = self.__dict__.get("_best_tensor_dict")
        if held is not None:
            return held
        if self._best_round is None:
            raise AttributeError("best_tensor_dict: no round has been the best yet")
        tensors, _ = utils.deconstruct_model_proto(utils.load_proto(str(self.best_state_path)),
                                                   self.compression_pipeline)
        return tensors

    @best_tensor_dict.setter
    def best_tensor_dict(self, tensor_dict: dict) -> None:  # OpenFL's own _save_model (persist_checkpoint) sets it
        self._best_tensor_dict = tensor_dict

    def _write_model(self, tensor_dict: dict, round_number: int, file_path) -> None:
        # OpenFL's file, written a tensor at a time (OpenFL's writer held about four times the model at once).
        model_file.write_model_file(file_path, tensor_dict, round_number, self.compression_pipeline)

    def get_tasks(self, collaborator_name):
        """OpenFL's answer, but a collaborator with nothing to do (its round's tasks done, the others still working)
        is not told to sleep: its request is held until the round ends, then answered with the next round's tasks
        (or the quit signal), or after poll_interval_s with "ask again now". OpenFL would tell it to sleep
        `Aggregator._get_sleep_time()` = 10 s (called on the class, not on self: overriding that staticmethod has no
        effect, tests/test_aggregator.py shows it), and a sleep of whole seconds (GetTasksResponse.sleep_time is an
        int32) costs half a poll on average after every round."""
        tasks, round_number, sleep_time, time_to_quit = self._get_tasks(collaborator_name)
        if tasks or time_to_quit:
            return tasks, round_number, sleep_time, time_to_quit
        if not self._wait_for_round_end(round_number, self.poll_interval_s):
            return tasks, round_number, self.poll_interval_s, time_to_quit  # not held: as OpenFL, a plan-set sleep
        tasks, round_number, sleep_time, time_to_quit = self._get_tasks(collaborator_name)
        # Nothing yet (a long round, or a straggler waiting for the round to end): ask again at once, to be held again.
        return tasks, round_number, 0 if not tasks else sleep_time, time_to_quit

    def _get_tasks(self, collaborator_name):
        """OpenFL's get_tasks; tasks sent: a status event (src.process.party_events) with who is done with the round."""
        tasks, round_number, sleep_time, time_to_quit = super().get_tasks(collaborator_name)
        if tasks:
            emit(AGGREGATOR_PARTY, "waiting for collaborators", round_number, reported=list(self.collaborators_done))
        return tasks, round_number, sleep_time, time_to_quit

    def _is_collaborator_done(self, collaborator_name: str, round_number: int) -> None:
        done = len(self.collaborators_done)
        super()._is_collaborator_done(collaborator_name, round_number)
        if len(self.collaborators_done) != done:
            emit(AGGREGATOR_PARTY, "waiting for collaborators", self.round_number,
                 reported=list(self.collaborators_done))

    def _wait_for_round_end(self, round_number: int, timeout_s: float) -> bool:
        """Wait until round `round_number` has ended or `timeout_s` passed; False if no request may be held now."""
        with self._round_ended:
            if self._held_requests >= MAX_HELD_REQUESTS:
                return False
            self._held_requests += 1
            try:
                self._round_ended.wait_for(lambda: self.round_number != round_number or self._time_to_quit(),
                                           timeout=timeout_s)
            finally:
                self._held_requests -= 1
        return True

    def _warn_insecure(self) -> None:
        if self.insecure:
            logger.warning("Round %d runs with network.settings.%s: false: no %s; any process that reaches this "
                           "port may claim a collaborator's name", self.round_number, self.insecure[0],
                           "TLS" if self.insecure[0] == "use_tls" else "client certificate is asked for")

    def _end_of_round_check(self):
        round_number = self.round_number
        try:
            super()._end_of_round_check()
        finally:
            if self.round_number != round_number and not self._time_to_quit():
                self._warn_insecure()  # every round the federation runs without transport security
            if self.round_number != round_number and self._time_to_quit():
                emit(AGGREGATOR_PARTY, "done", round_number)
            if (self.round_number != round_number and self._collaborators_use_deltas is False
                    and isinstance(self.tensor_db, IndexedTensorDB)):
                # what only a collaborator with delta updates reads (IndexedTensorDB.drop_model_copies)
                self.tensor_db.drop_model_copies(self.round_number, self.uuid)
            if self.round_number != round_number and isinstance(self.tensor_db, IndexedTensorDB):
                # OpenFL's clean_up keeps every round's metric rows; the rounds' readers (the aggregation functions,
                # this report, the callbacks) read only the round that ends: older ones go as its tensors do.
                self.tensor_db.drop_reports_before(self.round_number - self.db_store_rounds)
            with self._round_ended:  # wake the held requests: the next round's tasks (or the quit signal) are ready
                self._round_ended.notify_all()
