"""One round's audit of a party's update: the enabled audit steps (audit.config.steps), in order, on one context.

Given the model the party received this round (global) and the model it trained from it (local), each step the plan
enables runs on the same `AuditContext`: the membership audit (signals on members, non-members and population, the
population and update attacks), the Fidel reconstruction audit, the deanonymization self-audit, and any registered
plug-in. Then the round's leak verdict (audit.verdict.leak) pools every step's evidence: every membership attack's
figures tested against chance, any other step's own tests and epsilon bounds, corrected for how many were looked at.
Returns the round record (audit.round_record.RoundRecord) the report writer stores, with flat scalar metrics that may
leave the party.
"""

from __future__ import annotations

import itertools
import time
import zlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import torch

from audit.config.audit_settings import AuditSettings
from audit.config.steps import AFTER_TRAINING, AuditStep, check_step_result, registered
from audit.config.vocabulary import FINAL
from audit.record_parts import RecordSettings
from audit.round_record import AttackKey, RoundRecord, attack_keys
from audit.scaled_pixels import select_rows
from audit.spill import ModelSource
from audit.training import TrainingRecipe
from audit.verdict.leak import Evidence, attack_evidence, leak_verdict

__all__ = ["SETS", "AuditSets", "LocalTraining", "AuditContext", "StepResult", "SentUpdate", "audit_round",
           "audit_final_model", "attacks_evidence", "sample_seed", "round_seed", "FINAL"]

SETS = ("members", "nonmembers", "population")

_unnamed = itertools.count()


def _fresh_label() -> str:
    return f"sets-{next(_unnamed)}"


@dataclass(frozen=True)
class AuditSets:
    """The three sample sets the audit needs, each (x, y), under a label that names their contents: the signal cache
    (audit.membership.signal_cache) keys a set by its label and name. An owner gives one label to one content; sets
    built without one get a label of their own."""

    members: tuple[np.ndarray, np.ndarray]
    nonmembers: tuple[np.ndarray, np.ndarray]
    population: tuple[np.ndarray, np.ndarray]
    # For a sample (`sampled`): set name -> the size of the set it was drawn from; None: the sets themselves.
    drawn_from: Mapping[str, int] | None = None
    label: str = field(default_factory=_fresh_label)

    @classmethod
    def from_mapping(cls, sets: Mapping[str, tuple[np.ndarray, np.ndarray]], label: str | None = None) -> "AuditSets":
        missing = [name for name in SETS if name not in sets]
        if missing:
            raise ValueError(f"audit sets: missing {missing}; need {list(SETS)}")
        return cls(**{name: sets[name] for name in SETS}, **({} if label is None else {"label": label}))

    def labelled(self, label: str) -> "AuditSets":
        return replace(self, label=label)

    def tensors(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        """The set as tensors: floating inputs as float32, integer inputs (token ids) as they are, labels int64."""
        x, y = getattr(self, name)
        x = torch.as_tensor(np.asarray(x), device="cpu")  # host data: the signals move it to the model's device
        if x.is_floating_point():
            x = x.float()
        return x, torch.as_tensor(np.asarray(y), dtype=torch.int64, device="cpu")

    def sizes(self) -> dict[str, int]:
        return {name: int(len(getattr(self, name)[1])) for name in SETS}

    def sampled(self, size: int | None, seed: int) -> "AuditSets":
        """Each set cut to at most `size` samples, drawn uniformly without replacement (each set from its own
        stream of `seed`; indices sorted, so the samples keep the data's order); itself when no set is larger. The
        sample's label is its source's, size and seed: the same draw from the same sets has the same label. A set
        held as pixels (ScaledPixels) stays pixels: the sample copies its rows' pixels, not their float32 values.

        A simple random sample of a finite set: an interval computed from the sample's counts (Clopper-Pearson,
        the AUC's) covers the whole set's value at least as often as its level says (sampling without replacement only
        narrows the spread)."""
        sizes = self.sizes()
        if size is None or all(n <= size for n in sizes.values()):
            return self
        picked = {}
        for i, name in enumerate(SETS):
            x, y = getattr(self, name)
            if sizes[name] <= size:
                picked[name] = (x, y)
                continue
            index = np.sort(np.random.default_rng([seed, i]).choice(sizes[name], size=size, replace=False))
            picked[name] = (select_rows(x, index), np.asarray(y)[index])
        return AuditSets(**picked, drawn_from=sizes, label=f"{self.label}/sample{size}@{seed}")

    def sampling(self) -> dict:
        """What a round record says of the sampling: set name -> {audited, of} (of: the set's whole size)."""
        sizes = self.sizes()
        whole = self.drawn_from or sizes
        return {name: {"audited": sizes[name], "of": int(whole[name])} for name in SETS}


def sample_seed(seed: int | None, party: str) -> int:
    """The seed of a party's audit sample: the same every round (the rounds compare on the same samples) and for the
    same plan, whatever order the parties run in."""
    return zlib.crc32(f"{seed or 0}/{party}/audit_sample".encode()) & 0x7FFFFFFF


def round_seed(seed: int, party: str, round_num: int) -> int:
    """A seed per (plan seed, party, round): runs are reproducible whatever order parties run in."""
    return zlib.crc32(f"{seed}/{party}/{round_num}".encode()) & 0x7FFFFFFF


@dataclass(frozen=True)
class LocalTraining:
    """The party's local training, for audits that train like it (shadow updates, reference models)."""

    recipe: TrainingRecipe          # optimiser, learning rate, epochs, batch size
    member_count: int               # how many samples the real update was trained on (before any mitigation)
    federation_alpha: float | None  # the federation's label skew (None = IID)
    # When the audited update was trained with DP-SGD: the party's DP training as a callable
    # (audit.canary.dp.DPTrainer), so an audit can train exactly like it. None: plain training with `recipe`.
    dp: object | None = None
    # The update mitigation applied to what is sent (audit.config.mitigation_settings.Mitigation: noise, dp_fedavg),
    # for audits that reproduce the whole release. None: the trained update is sent as it is.
    update_mitigation: object | None = None


@dataclass(frozen=True)
class AuditContext:
    """Everything a step may use: the two models (read only: a step that trains or changes one works on a copy), the
    sets, the settings and the party's training."""

    local_model: torch.nn.Module
    global_model: torch.nn.Module | None  # None when the round has no received model to compare with
    sets: AuditSets
    settings: AuditSettings
    party: str
    round_num: int
    seed: int | None
    training: LocalTraining | None
    # The federation's starting point, which every party has without anyone's data (the plan's initial model): the
    # model or a zero-argument callable giving it (audit.spill.ModelSource), which a step calls only when it needs
    # the weights (RMIA's independent references when they start), so a caller can keep it out of memory meanwhile.
    initial_model: ModelSource | None = None
    # The party's own state across rounds and audits (e.g. reference models a step keeps training); each step keeps
    # its entries under its own name. A fresh dict per audit_round call unless the caller keeps one.
    store: dict = field(default_factory=dict)
    # The party's audit.membership.signal_cache.SignalCache: signals already computed this round on the same weights
    # and sets (e.g. during the validation of the received model) are reused. None: every step computes its own.
    signal_cache: object | None = None
    # The membership audits' sets (signals, population, update and RMIA attacks): `sets` sampled to the settings'
    # sample_size (AuditSets.sampled). Audits that need every sample (Fidel's matching of reconstructions to the
    # members, the deanonymization crowd) use `sets`. None: `sets`.
    mia_sets: AuditSets | None = None
    # Which model `local_model` is: the party's trained model ("local"), or the final global model after the last
    # round ("final", audited against the party's members with no received model beside it: audit_final_model).
    model_kind: str = "local"

    def __post_init__(self):
        if self.mia_sets is None:
            object.__setattr__(self, "mia_sets", self.sets)


@dataclass
class StepResult:
    """What a step returns: scalars that may leave the party, and what stays in its own report."""

    metrics: dict[str, float]
    details: dict | None = None                 # JSON-able; the record keeps it as RoundRecord.extra[<step name>]
    # Membership attacks, AttackKey -> AttackResult (audit.membership.population_attack): RoundRecord.attacks; their
    # metric names are AttackKey.metric(statistic).
    attacks: dict[AttackKey, object] | None = None
    timings: dict = field(default_factory=dict)  # merged into RoundRecord.timings
    # Writes the party's private artefacts (e.g. reconstructed images) into its own round folder; never sent.
    write_private: Callable[[Path], None] | None = None
    # Tests against chance and epsilon bounds for the round's leak verdict beyond those of `attacks` (which are
    # tested from their scores whatever step returns them).
    evidence: Evidence | None = None


@dataclass(frozen=True)
class SentUpdate:
    """What a party sent at the end of a round, for the steps that follow its updates across rounds (a step's
    `after_sending`, audit.config.steps): the model holding the sent weights (read only; None when nothing new was
    sent), whether the aggregator's average takes it (False: withheld, or the received model was rejected), the
    party's data (its training-set size, the plan's data split) and the plan's collaborator settings (the plan-wide
    ones and the per-collaborator ones by name: every party's gate and mitigation)."""

    party: str
    round_num: int
    model: torch.nn.Module | None
    averaged: bool
    data: object = None
    collaborators: tuple | None = None


def _runs(audit_step: AuditStep, context: AuditContext) -> bool:
    if context.model_kind == FINAL:  # the steps that audit a model, not an update, whatever their schedule
        return audit_step.phase == AFTER_TRAINING and audit_step.final_model and audit_step.enabled(context.settings)
    if audit_step.phase != AFTER_TRAINING:  # a check of the received model ran before training (audit.before_training)
        return False
    if audit_step.needs_global and context.global_model is None:
        return False
    return audit_step.due(context.settings, context.round_num)


def audit_round(
    local_model: torch.nn.Module,
    global_model: torch.nn.Module | None,
    sets: AuditSets,
    settings: AuditSettings,
    *,
    party: str,
    round_num: int,
    seed: int | None = None,
    training: LocalTraining | None = None,
    steps: tuple[AuditStep, ...] | None = None,
    initial_model: ModelSource | None = None,
    store: dict | None = None,
    signal_cache=None,
    mia_sets: AuditSets | None = None,
    run_rounds: int | None = None,
    model_kind: str = "local",
) -> RoundRecord:
    """Audit one round with every enabled step (default: all registered ones); returns the round record
    (audit.round_record.RoundRecord), whose attacks hold AttackResult objects and whose `private` holds the steps'
    writers of the party's private files. `training`: the party's local training, for the steps that train like it
    (deanonymization, RMIA's references); `initial_model`: the plan's initial model (RMIA's independent references start from it), or a
    zero-argument callable giving it, called only if a step needs it this round (audit.spill.load_model); `store`:
    the party's state kept across rounds (the same dict every round); `signal_cache`: the party's SignalCache
    (audit.membership.signal_cache), whose signals are reused on the same weights and set labels; `mia_sets`: the
    membership audits' sample of `sets` (default: `sets.sampled(settings.sample_size, sample_seed(seed, party))`,
    labelled by `sets`' label, size and seed); `run_rounds`: the run's rounds, when known (the leak verdict then also
    gives the epsilon bound corrected for them, audit.verdict.leak); `model_kind`: "local" (the trained model, beside
    the received `global_model`) or FINAL (the final global model alone: audit_final_model)."""
    start = time.perf_counter()
    if mia_sets is None:
        mia_sets = sets.sampled(settings.sample_size, sample_seed(seed, party))
    context = AuditContext(local_model, global_model, sets, settings, party, int(round_num), seed, training,
                           initial_model, {} if store is None else store, signal_cache, mia_sets, model_kind)
    record = RoundRecord(party=party, round=int(round_num), seed=seed, settings=RecordSettings.of(settings),
                         sizes=mia_sets.sizes(),  # what the membership audits used
                         sampling={"sample_size": settings.sample_size, "sets": mia_sets.sampling()})
    private = []
    evidence = Evidence()
    produced: dict[str, str] = {}  # metric name -> the step that produced it this round
    attacks_produced: dict[AttackKey, str] = {}
    for audit_step in steps if steps is not None else registered():
        if not _runs(audit_step, context):
            continue
        step_start = time.perf_counter()
        result = audit_step.load_run()(context, audit_step.settings_of(settings))
        record.timings[f"{audit_step.name}_s"] = time.perf_counter() - step_start
        attacks = attack_keys(result.attacks or {})
        # A step owns its names: one that returns another's (or the gate's, or the verdict's) fails the round.
        check_step_result(audit_step, result.metrics, attacks, produced, attacks_produced)
        produced.update(dict.fromkeys(result.metrics, audit_step.name))
        attacks_produced.update(dict.fromkeys(attacks, audit_step.name))
        record.metrics.update(result.metrics)
        if attacks:
            record.add_attacks(attacks)
        if result.details is not None:
            record.extra[audit_step.name] = result.details
        record.timings.update(result.timings)
        if result.write_private is not None:
            private.append(result.write_private)
        if result.evidence is not None:
            evidence += result.evidence
    verdict = leak_verdict(evidence + attacks_evidence(record.attacks), confidence=settings.confidence,
                           delta=settings.epsilon_delta, run_rounds=run_rounds)
    record.metrics.update(verdict.metrics)
    record.leak = verdict.to_dict()
    record.private = tuple(private)  # in memory only: never in the record's JSON
    record.timings["audit_s"] = time.perf_counter() - start
    return record


def attacks_evidence(attacks: Mapping[AttackKey, object]) -> Evidence:
    """The membership attacks' evidence (AttackKey -> AttackResult), each tested from its own scores."""
    found = Evidence()
    for key, result in attacks.items():
        found += attack_evidence(key.label(), key.metric, result.uncertainty)
    return found


def audit_final_model(model: torch.nn.Module, sets: AuditSets, settings: AuditSettings, *, party: str,
                      round_num: int, **kwargs) -> RoundRecord:
    """The final global model after the last round, audited against the party's members: every enabled step that
    audits a model rather than an update (AuditStep.final_model: the population attacks on each signal, RMIA with the
    references of the party's last audited round), whatever their schedule, then their leak verdict. The attacks are
    keyed by the model kind FINAL (mia_final_<signal>_*; RMIA's keep their reference kind). `round_num`: the round
    after the last (the number of training rounds). The other keywords are audit_round's."""
    return audit_round(model, None, sets, settings, party=party, round_num=round_num, model_kind=FINAL, **kwargs)
