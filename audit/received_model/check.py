"""The received-model check, the BEFORE_TRAINING step `received_model`: the four checks in order, their figures, and
one alarm ("<check>: <figure>", the first that fires) or none.

1. architecture (audit.received_model.architecture): a model that does not fit the plan stops here;
2. history (audit.received_model.history): per-tensor change against the honest envelope;
3. structure (audit.received_model.structure): parallel rows, ReLU support, the classifier's class scale;
4. leakage probe (audit.received_model.probe): samples of the fixed probe batch the first dense layer gives back,
   against the honest references (the plan's initial model, built from the plan's seed; the latest global models this
   party trained on without an alarm), compared on the same samples.

What the party keeps across rounds (`ProbeState`, in the phase's store under "received_model"): the probe batch's rows,
the references' per-sample read-back, the history's norms. All of it stays with the party.
"""

from __future__ import annotations

import math
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
from torch import nn

from audit.before_training import ReceivedCheck, ReceivedContext
from audit.received_model.architecture import check_architecture, plan_tensors
from audit.received_model.history import HistoryState, change_norms, judge_changes
from audit.received_model.probe import capture_linear_layers, clopper_pearson, mcnemar_greater, probe_captures
from audit.config.received_model_settings import ARCHITECTURE, HISTORY, PROBE, REJECT, STRUCTURE, ReceivedModelSettings
from audit.received_model.structure import class_weight_ratio, parallel_rows, relu_support
from audit.scaled_pixels import take_rows
from audit.spill import load_model

__all__ = ["run", "ProbeState", "STORE_KEY"]

STORE_KEY = "received_model"
# Earlier rounds whose read-back is kept as an honest reference (the most recent ones; with the plan's initial model):
# bounded whatever the rounds, and each one a test per round.
_MAX_REFERENCES = 10


@dataclass
class ProbeState:
    """The party's memory of the check across rounds."""

    rows: np.ndarray | None = None                          # the probe batch: rows of the members, fixed
    references: dict[str, np.ndarray] = field(default_factory=dict)  # name -> per-sample read-back (bool)
    history: HistoryState = field(default_factory=HistoryState)

    def batch(self, context: ReceivedContext):
        x, y = context.members
        if self.rows is None:
            n = len(y)
            rng = np.random.default_rng([context.seed or 0, zlib.crc32(f"{context.party}/probe".encode())])
            self.rows = np.sort(rng.choice(n, size=min(n, context.batch_size), replace=False))
        return np.asarray(take_rows(x, self.rows)), np.asarray(y)[self.rows]  # token ids stay integer


def _plan_initial_reference(context: ReceivedContext, state: ProbeState, x, y) -> None:
    """The plan's initial model's read-back of the probe batch, once per party."""
    if "plan initial model" in state.references or context.plan_initial is None:
        return
    model = load_model(context.plan_initial)
    tensors = {name: t.detach() for name, t in plan_tensors(model).items()}
    captures = capture_linear_layers(context.template, tensors, x, y)
    state.references["plan initial model"] = probe_captures(captures, x).revealed


def _structure(context, tensors, captures, settings: ReceivedModelSettings) -> tuple[dict, list[str]]:
    """The figures of audit.received_model.structure for every linear layer, and the alarms they raise."""
    figures: dict = {"parallel_rows": {}, "support": {}, "classifier": None}
    alarms: list[str] = []
    for name, module in context.template.named_modules():
        if isinstance(module, nn.Linear) and f"{name}.weight" in tensors:
            rows = parallel_rows(tensors[f"{name}.weight"], tensors.get(f"{name}.bias"))
            figures["parallel_rows"][name] = rows
            if settings.parallel_rows is not None and rows["rows"] >= settings.parallel_rows:
                alarms.append(f"{STRUCTURE}: {rows['rows']} of {rows['of']} rows of {name} are scaled copies of one "
                              f"direction ({rows['distinct_offsets']} distinct offsets; at most "
                              f"{settings.parallel_rows - 1} allowed)")
    for layer in captures[:-1]:  # the classifier's outputs all move: its support says nothing
        support = relu_support(layer)
        figures["support"][layer.name] = support
        if support is None:
            continue
        where = f"of {support['live_neurons']} live neurons of {layer.name} on {support['batch']} samples"
        if settings.min_support is not None and support["mean_support"] < settings.min_support:
            alarms.append(f"{STRUCTURE}: each live neuron {where} is moved by {support['mean_support']:.3f} of the "
                          f"batch on average (at least {settings.min_support:g} expected)")
        if settings.max_isolating is not None and support["isolating"] > settings.max_isolating:
            alarms.append(f"{STRUCTURE}: {support['isolating']:.3f} {where} are moved by exactly one sample (at most "
                          f"{settings.max_isolating:g} allowed)")
    if captures:
        name = captures[-1].name
        ratio = class_weight_ratio(tensors[f"{name}.weight"])
        # strict JSON has no Infinity: a zero median row (every other class zeroed) is said so
        figures["classifier"] = {"layer": name, "class_weight_ratio": ratio if math.isfinite(ratio) else None,
                                 "median_row_zero": not math.isfinite(ratio)}
        if settings.class_weight_ratio is not None and ratio > settings.class_weight_ratio:
            alarms.append(f"{STRUCTURE}: the largest class weight row of {name} is {ratio:.3g}x the median one "
                          f"(at most {settings.class_weight_ratio:g} allowed)")
    return figures, alarms


def _judge_probe(result, references: dict[str, np.ndarray], settings: ReceivedModelSettings) -> tuple[dict, str | None]:
    n, count = result.batch, result.count
    figures = {**result.to_dict(), "references": {}}
    if not references or result.first_layer is None:
        figures["judged"] = False  # no honest reference (or no dense layer): the count is reported, not judged
        return figures, None
    tests = {}
    for name, mask in references.items():
        tests[name] = {"revealed": int(mask.sum()), "mcnemar_p": mcnemar_greater(result.revealed, mask)}
    figures["references"], figures["judged"] = tests, True
    strongest = max(tests, key=lambda k: (tests[k]["revealed"], tests[k]["mcnemar_p"]))
    worst_p = max(t["mcnemar_p"] for t in tests.values())
    most = tests[strongest]["revealed"]
    if settings.probe_margin is None:
        return figures, None
    margin = settings.probe_margin * n
    if count - most >= margin and worst_p < settings.probe_alpha:
        low, high = clopper_pearson(count, n)
        return figures, (f"{PROBE}: {count} of {n} samples read back from the update at {result.first_layer} "
                         f"(95% interval {low:.2f}-{high:.2f} of the batch); honest references at most {most} "
                         f"({strongest}); excess >= {margin:g} samples, McNemar p <= {worst_p:.2g} < "
                         f"{settings.probe_alpha:g} against each of {len(tests)}")
    return figures, None


def run(context: ReceivedContext, settings: ReceivedModelSettings) -> ReceivedCheck:
    state: ProbeState = context.store.setdefault(STORE_KEY, ProbeState())
    reject = settings.action == REJECT
    timings: dict[str, float] = {}
    start = time.perf_counter()
    architecture = check_architecture(context.received, context.template)
    details: dict = {"architecture": architecture.to_dict(), "settings": settings.to_dict(), "timings": timings}
    timings["architecture_s"] = time.perf_counter() - start
    if not architecture.passed:  # nothing else can be read off tensors that do not fit the plan
        details["alarms"] = [f"{ARCHITECTURE}: {architecture.figure()}"]
        return ReceivedCheck(details["alarms"][0], reject, details)
    tensors = architecture.tensors
    alarms: list[str] = []

    start = time.perf_counter()
    change = None
    if context.previous is not None:
        change = change_norms(context.received, context.previous.load())
        history = judge_changes(change, state.history)
        ratio = history["ratio"]
        if settings.max_change_ratio is not None and ratio is not None and ratio > settings.max_change_ratio:
            alarms.append(f"{HISTORY}: {history['tensor']} moved {ratio:.3g}x the most an honest round moved it "
                          f"({history['change']:.3g} against {history['envelope']:.3g}; at most "
                          f"{settings.max_change_ratio:g}x allowed)")
    else:
        history = {"ratio": None, "judged": 0, "note": "no earlier global model accepted"}
    details["history"] = {**history, "previous_round": None if context.previous is None
                          else context.previous.round_num}
    timings["history_s"] = time.perf_counter() - start

    start = time.perf_counter()
    x, y = state.batch(context)
    captures = capture_linear_layers(context.template, tensors, x, y)
    result = probe_captures(captures, x)
    timings["probe_step_s"] = time.perf_counter() - start

    start = time.perf_counter()
    details["structure"], structure_alarms = _structure(context, tensors, captures, settings)
    alarms += structure_alarms
    timings["structure_s"] = time.perf_counter() - start

    start = time.perf_counter()
    _plan_initial_reference(context, state, x, y)
    timings["plan_initial_reference_s"] = time.perf_counter() - start
    details["probe"], probe_alarm = _judge_probe(result, state.references, settings)
    if probe_alarm:
        alarms.append(probe_alarm)
    details["alarms"] = alarms

    def remember(received, sent, round_num=context.round_num, revealed=result.revealed, change=change,
                 flagged=bool(alarms)):
        # a global model the party trained on: its own update is the history's reference from now on; the model's
        # change and read-back become honest references only if no check flagged it (report_only trains on those)
        state.history.remember(received, sent, round_num, None if flagged else change)
        if flagged:
            return
        state.references[f"round {round_num}"] = revealed
        rounds = [k for k in state.references if k.startswith("round ")]
        for old in rounds[:-_MAX_REFERENCES]:
            del state.references[old]

    return ReceivedCheck(alarms[0] if alarms else None, reject and bool(alarms), details, remember)
