"""The aggregator-side deanonymization audit as an OpenFL callback (`aggregator.settings.deanon`).

The paper's honest-but-curious server (Orekondy et al., seeds 000/001), run by the aggregator on the real updates:
at the end of every round the callback reads from the aggregator's TensorDB the global model the collaborators
started the round from and each collaborator's trained tensors of one layer, keeps the L2-normalised update
vectors (audit.deanon.server.UpdateHistory), and from the round where `min_history_rounds` earlier rounds are
stored trains the attacks on the earlier rounds and asks them to name the owners of this round's updates
(audit's evaluate_deanon_round: closed and open world, AP over chance).

What the TensorDB holds at `on_round_end(r, logs)` (OpenFL 1.9, measured in an in-process run; the hook runs after
aggregation and before the store is cleaned, `r` counting from 0):
    (name, origin, r,   False, ('model',))             the global model every collaborator received in round r
    (name, origin, r,   False, (col, 'trained'))       collaborator col's trained tensors of round r
    (name, origin, r,   False, ('trained',))           the aggregated result of round r
    (name, origin, r+1, False, ('model',)), (..., ('aggregated',)), (..., ('aggregated', 'delta'))  the next model
Tensor names are the task runner's state-dict keys; in this workspace the network sits in the runner's `model`
attribute, so the output layer's tensors are `model.classifier.out.weight` and `model.classifier.out.bias`.
A collaborator that withheld its update (the gate returned the received weights) sent trained == received: no
update to attack, skipped (and listed as such in the round's record).

Layer: `layer: null` takes the module of the model's last tensor, i.e. the last `('model',)` row of the round in
TensorDB order, which is the order of the initial tensor dict (the task runner's state dict: parameters in
registration order, the output layer last in our models); optimizer state that OpenFL may keep in the model
(`__opt_state...` tensors) is left out. A configured name is matched against the tensor names as given or, if no
tensor starts with it, as a module nested in the runner (`classifier.out` -> `model.classifier.out`). The module is
fixed at the first round and kept for the run, so that every stored vector has the same meaning.

Files under `<report_dir>/deanon/` (written atomically; the summaries are rebuilt from the round files on disk):
    round_NNNN.json       the round's record (status, per attack and world AP / chance / AP over chance / top-1 ...)
    summary.csv          one row per round
    ap_over_chance.png   round vs AP over chance per attack, chance line at 1

An exception inside `on_round_end` would leave the federation stuck in the round (OpenFL calls the hook before it
moves on): it is logged with its traceback, kept in `self.errors`, written as a round record with status "error"
if possible, and never raised.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Iterable

import numpy as np
from openfl.callbacks import Callback

from audit import DeanonReportWriter, UpdateHistory, evaluate_deanon_round, parse
from src.server.settings import DEANON_PREFIX, PREFIX, REPORT_DIR, DeanonServerSettings

logger = logging.getLogger(__name__)

MODEL_TAGS = ("model",)
TRAINED = "trained"
ERROR = "error"
# Tags a collaborator's decoded update may carry besides its name and 'trained' (lossy compression pipelines).
_UPDATE_EXTRA_TAGS = {"lossy_decompressed"}
_OPTIMIZER_PREFIX = "__opt"


def model_tensor_names(names: Iterable[str]) -> list[str]:
    """The model's tensor names, without optimizer state OpenFL may keep next to them."""
    return [n for n in names if not n.startswith(_OPTIMIZER_PREFIX)]


def default_layer(names: Iterable[str]) -> str:
    """The module of the last model tensor (`model.classifier.out.bias` -> `model.classifier.out`)."""
    names = model_tensor_names(names)
    if not names:
        raise ValueError("no model tensor to take the default layer from")
    module, dot, _param = names[-1].rpartition(".")
    if not dot:
        raise ValueError(f"the last model tensor {names[-1]!r} belongs to no module; set "
                         "aggregator.settings.deanon.layer")
    return module


def resolve_layer(names: Iterable[str], layer: str) -> tuple[str, list[str]]:
    """(module, its tensor names in the given order) for `layer`, as given or nested in the runner (see above)."""
    names = model_tensor_names(names)

    def direct(module: str) -> list[str]:
        prefix = f"{module}."
        return [n for n in names if n.startswith(prefix) and "." not in n[len(prefix):]]

    found = direct(layer)
    if found:
        return layer, found
    nested = sorted({n.rpartition(".")[0] for n in names if n.rpartition(".")[0].endswith(f".{layer}")})
    if len(nested) == 1:
        return nested[0], direct(nested[0])
    modules = sorted({n.rpartition(".")[0] for n in names})
    if nested:
        raise ValueError(f"aggregator.settings.deanon.layer: {layer!r} is ambiguous: {', '.join(nested)}")
    raise ValueError(f"aggregator.settings.deanon.layer: no tensor of module {layer!r}; modules with tensors: "
                     f"{', '.join(modules)}")


class DeanonymizationCallback(Callback):
    """Aggregator-side deanonymization audit of the real updates, one record per round (module docstring)."""

    def __init__(self, report_dir, **settings):
        """`settings`: those of `aggregator.settings.deanon` (DeanonServerSettings; enabled: the callback is on)."""
        super().__init__()
        self.settings = parse(DeanonServerSettings, {"enabled": True, **settings}, DEANON_PREFIX)
        self.writer = DeanonReportWriter(Path(REPORT_DIR(f"{PREFIX}.report_dir", report_dir)) / "deanon")
        self.history = UpdateHistory()
        self.aggregator = None
        self.module: str | None = None        # the resolved layer, fixed at the first round
        self.tensor_names: list[str] | None = None
        self.results: dict[int, dict] = {}    # round -> record (scalars only, as written)
        self.errors: list[str] = []

    @property
    def root(self) -> Path:
        return self.writer.root

    def set_aggregator(self, aggregator) -> None:
        self.aggregator = aggregator

    def on_round_end(self, round_num: int, logs=None):
        if not self.settings.enabled or getattr(self.aggregator, "final_round", None) == round_num:
            return  # the round after the last trains nothing: no update to attack
        # See the module docstring: never raise from here.
        try:
            record = self.audit_round(round_num)
            path = self.writer.write_round(record)
            self.results[int(round_num)] = record
            logger.info("Round %d deanonymization audit: %s -> %s", round_num, _headline(record), path)
        except Exception as err:  # noqa: BLE001
            self.errors.append(f"round {round_num}: {err!r}")
            logger.exception("Round %d: the aggregator-side deanonymization audit failed (report folder %s); "
                             "the federation goes on", round_num, self.writer.root)
            try:
                self.writer.write_round({"round": int(round_num), "status": ERROR, "reason": repr(err)})
            except Exception:  # noqa: BLE001 - e.g. the folder itself cannot be written
                logger.exception("Round %d: could not write the deanonymization error record either", round_num)

    # ------------------------------------------------------------------------------------------------
    def audit_round(self, round_num: int) -> dict:
        """Store this round's update vectors, evaluate the round; the record (JSON-able, no vectors)."""
        start = time.perf_counter()
        received, trained = self.read_round(round_num)
        for col in sorted(trained):
            self.history.add(round_num, col, received, trained[col], self.tensor_names)
        record = evaluate_deanon_round(self.history, round_num, attacks=self.settings.attacks,
                                       min_history_rounds=self.settings.min_history_rounds, seed=self.settings.seed)
        record["layer"] = {"requested": self.settings.layer, "module": self.module, "tensors": self.tensor_names,
                           "rule": ("aggregator.settings.deanon.layer" if self.settings.layer else
                                    "module of the model's last tensor")}
        record["updates_received"] = sorted(trained)
        record["history"] = {"updates": len(self.history), "bytes": self.history.nbytes}
        record["callback_seconds"] = time.perf_counter() - start
        return record

    def read_round(self, round_num: int) -> tuple[dict, dict]:
        """(global weights of the round's start, {collaborator: trained weights}) of the audited layer."""
        if self.tensor_db is None:
            raise RuntimeError("no TensorDB: the callback was not registered with an aggregator")
        frame = self.tensor_db.tensor_db
        rows = frame[frame["round"].astype(int) == int(round_num)]
        model_rows = [(n, a) for n, t, a in zip(rows["tensor_name"], rows["tags"], rows["nparray"])
                      if tuple(t or ()) == MODEL_TAGS]
        if not model_rows:
            raise RuntimeError(f"round {round_num}: the TensorDB holds no global model (tags {MODEL_TAGS}) of this round")
        if self.tensor_names is None:
            names = [n for n, _ in model_rows]
            layer = self.settings.layer or default_layer(names)
            self.module, self.tensor_names = resolve_layer(names, layer)
            logger.info("Deanonymization audit of layer %s (tensors %s)", self.module, ", ".join(self.tensor_names))
        wanted = set(self.tensor_names)
        received = {n: np.asarray(a) for n, a in model_rows if n in wanted}
        authorized = set(getattr(self.aggregator, "authorized_cols", None) or ())
        trained: dict[str, dict] = {}
        for name, tags, array in zip(rows["tensor_name"], rows["tags"], rows["nparray"]):
            if name not in wanted:
                continue
            tags = set(tags or ())
            owners = tags - {TRAINED} - _UPDATE_EXTRA_TAGS
            if TRAINED not in tags or len(owners) != 1:
                continue  # the aggregated result ('trained',), deltas, models, metrics
            (col,) = owners
            if authorized and col not in authorized:
                continue
            trained.setdefault(col, {})[name] = np.asarray(array)
        return received, trained


def _headline(record: dict) -> str:
    if record.get("status") != "evaluated":
        return f"{record.get('status')}: {record.get('reason')}"
    parts = []
    for world in ("closed_world", "open_world"):
        section = record.get(world) or {}
        for kind in ("reidentification", "matching"):
            for attack, result in (section.get(kind) or {}).items():
                ratio = result.get("ap_over_chance")
                parts.append(f"{'open ' if world == 'open_world' else ''}{attack} AP/chance "
                             f"{ratio:.2f}" if isinstance(ratio, float) else f"{attack} n/a")
    return ", ".join(parts) or "no attack result"
