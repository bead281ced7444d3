"""Per-party privacy-audit reports: one directory per audited round plus cross-round summaries.

Layout (every file written atomically, see :mod:`audit.atomic_io`)::

    root/index.html                      links every party's report
    root/<party>/index.html              AUC + TPR plots, metrics table, per-round ROC images (newest first)
    root/<party>/metrics.csv             one row per round: "round", then the sorted metric names
    root/<party>/auc.png                 exact AUC per round for every model x signal
    root/<party>/tpr_at_<fpr:g>.png      TPR at each FPR tolerance per round
    root/<party>/round_0003/audit.json   the round record, exactly as given
    root/<party>/round_0003/roc.png      ROC curves: one subplot per audited model

The cross-round files are always rebuilt from the ``audit.json`` files on disk, so they are derived
state: a crash at any point leaves the previous report intact and the next write repairs it.

A round record (a JSON-able dict) looks like::

    {"party": "collaborator1", "round": 3, "seed": 0, "settings": {...}, "timings": {...},
     "attacks": {"local": {"loss": A, ...}, "global": {...}, "update": {"loss_reduction": A}},
     "metrics": {"mia_local_loss_auc": 0.61, ...},      # flat, finite numbers
     "extra": {...}}

where ``A`` is ``AttackResult.to_dict()`` (``fpr``/``tpr`` lists, ``auc``, ``exact_auc``, ``tpr_at_fpr`` keyed by
``f"{tol:g}"``, ``n_members``/``n_nonmembers``...; non-finite numbers stored as None).

Two AUCs, labelled as such wherever they are shown: the "grid AUC" (``auc``, metric ``mia_*_auc``) is Privacy
Meter's, the area under the ROC curve drawn in ``roc.png``, whose thresholds are population quantiles on its
alpha grid (it does not reach beyond the population's range, so it under-reads on a small population); the
"exact AUC" (``exact_auc``, metric ``mia_*_exact_auc``) is the members-vs-non-members ROC AUC over every
threshold (Mann-Whitney; ties count half). ``auc.png`` plots the exact AUC.
"""

from __future__ import annotations

import csv
import datetime as _dt
import html
import io
import json
import logging
import math
import numbers
import os
import re
import zlib
from pathlib import Path
from typing import Any, Iterable, Mapping
from urllib.parse import quote

import numpy as np
from matplotlib.figure import Figure  # no pyplot: figures are never registered globally, so none leak
from matplotlib.ticker import MaxNLocator

from .atomic_io import atomic_savefig, atomic_write_json, atomic_write_text
from .csv_cells import spreadsheet_safe

__all__ = [
    "ReportWriter",
    "load_round_records",
    "write_index",
    "validate_record",
    "validate_party_name",
    "round_dir_name",
]

logger = logging.getLogger(__name__)

DPI = 100
MODEL_ORDER = ("local", "global", "update")
_MODEL_TITLES = {"local": "local model", "global": "global model", "update": "model update"}
_MODEL_STYLES = {"local": ("-", "o"), "global": ("--", "s"), "update": (":", "^")}
_OTHER_MODEL_STYLE = ("-.", "D")
_SIGNAL_COLORS = {
    "loss": "tab:blue",
    "logits": "tab:orange",
    "gradient_norm": "tab:green",
    "loss_reduction": "tab:red",
}
_EXTRA_COLORS = ("tab:purple", "tab:brown", "tab:pink", "tab:olive", "tab:cyan", "tab:gray")
_CHANCE_STYLE = {"color": "0.45", "linestyle": ":", "linewidth": 1.2}

_SAFE_PARTY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$")
_ROUND_DIR_RE = re.compile(r"^round_(\d+)$")
_TPR_PLOT_RE = re.compile(r"^tpr_at_.+\.png$")


# --------------------------------------------------------------------------------------------------
# validation


def validate_party_name(party: object) -> str:
    """Return ``party`` if it is a safe single path component, else raise ValueError."""
    if not isinstance(party, str) or not _SAFE_PARTY_RE.match(party) or ".." in party:
        raise ValueError(
            f"party name {party!r} is not a safe path component "
            "(letters, digits, '_', '.', '-', '@', '+'; no '/', no '..', not starting with '.'; <= 128 chars)"
        )
    return party


def round_dir_name(round_: int) -> str:
    return f"round_{round_:04d}"


def _is_int(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_finite_number(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _sub(where: str, key: str) -> str:
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"


def _validate_structure(record: object) -> None:
    """Cheap shape checks shared by writing and loading; raises ValueError naming the field."""
    if not isinstance(record, Mapping):
        raise ValueError(f"record must be a dict, got {type(record).__name__}")
    if "party" not in record:
        raise ValueError("record.party is missing")
    if not isinstance(record["party"], str):
        raise ValueError(f"record.party must be a str, got {type(record['party']).__name__}")
    try:
        validate_party_name(record["party"])
    except ValueError as e:
        raise ValueError(f"record.party: {e}") from None
    if "round" not in record:
        raise ValueError("record.round is missing")
    if not _is_int(record["round"]) or record["round"] < 0:
        raise ValueError(f"record.round must be an int >= 0, got {record['round']!r}")
    if "seed" in record and record["seed"] is not None and not _is_int(record["seed"]):
        raise ValueError(f"record.seed must be an int or None, got {record['seed']!r}")
    for key in ("settings", "timings", "extra"):
        if key in record and record[key] is not None and not isinstance(record[key], Mapping):
            raise ValueError(f"record.{key} must be a dict, got {type(record[key]).__name__}")

    if "attacks" not in record:
        raise ValueError("record.attacks is missing")
    attacks = record["attacks"]
    if not isinstance(attacks, Mapping):
        raise ValueError(f"record.attacks must be a dict (model -> signal -> result), got {type(attacks).__name__}")
    for model, per_signal in attacks.items():
        where = _sub("record.attacks", str(model))
        if not isinstance(model, str):
            raise ValueError(f"{where}: model names must be str, got {model!r}")
        if not isinstance(per_signal, Mapping):
            raise ValueError(f"{where} must be a dict (signal -> result), got {type(per_signal).__name__}")
        for signal, result in per_signal.items():
            w = _sub(where, str(signal))
            if not isinstance(signal, str):
                raise ValueError(f"{w}: signal names must be str, got {signal!r}")
            _validate_attack(result, w)

    if "metrics" not in record:
        raise ValueError("record.metrics is missing")
    metrics = record["metrics"]
    if not isinstance(metrics, Mapping):
        raise ValueError(f"record.metrics must be a dict of numbers, got {type(metrics).__name__}")
    for name, value in metrics.items():
        if not isinstance(name, str):
            raise ValueError(f"record.metrics: names must be str, got {name!r}")
        if not _is_finite_number(value):
            raise ValueError(f"{_sub('record.metrics', name)} must be a finite number, got {value!r}")


def _validate_attack(result: object, where: str) -> None:
    if not isinstance(result, Mapping):
        raise ValueError(f"{where} must be an attack-result dict, got {type(result).__name__}")
    for key in ("auc", "exact_auc"):
        auc = result.get(key)
        if auc is not None and not _is_finite_number(auc):
            raise ValueError(f"{where}.{key} must be a finite number or None, got {auc!r}")
    has_fpr, has_tpr = "fpr" in result, "tpr" in result
    if has_fpr != has_tpr:
        raise ValueError(f"{where}: 'fpr' and 'tpr' must be given together")
    if has_fpr:
        lengths = []
        for key in ("fpr", "tpr"):
            values = result[key]
            if not isinstance(values, (list, tuple, np.ndarray)):
                raise ValueError(f"{where}.{key} must be a list, got {type(values).__name__}")
            for i, v in enumerate(values):
                if v is None:
                    continue
                if not _is_finite_number(v) or not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"{where}.{key}[{i}] must be a rate in [0, 1] (or None), got {v!r}")
            lengths.append(len(values))
        if lengths[0] != lengths[1]:
            raise ValueError(f"{where}: fpr and tpr lengths differ ({lengths[0]} != {lengths[1]})")
    tpr_at = result.get("tpr_at_fpr")
    if tpr_at is not None and not isinstance(tpr_at, Mapping):
        raise ValueError(f"{where}.tpr_at_fpr must be a dict, got {type(tpr_at).__name__}")


def _check_jsonable(value: Any, where: str) -> None:
    """Strict-JSON check (no NaN/Infinity, str keys) naming the first offending field."""
    if value is None or isinstance(value, (str, bool)):
        return
    if isinstance(value, numbers.Integral):
        return
    if isinstance(value, numbers.Real):
        if not math.isfinite(float(value)):
            raise ValueError(f"{where} must be finite (strict JSON has no NaN/Infinity), got {value!r}")
        return
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{where} has a non-str key {k!r} (JSON object keys are strings)")
            _check_jsonable(v, _sub(where, k))
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_jsonable(v, f"{where}[{i}]")
        return
    if isinstance(value, (np.ndarray, np.generic)):
        _check_jsonable(value.tolist(), where)
        return
    raise ValueError(f"{where} is not JSON-serialisable ({type(value).__name__})")


def validate_record(record: object, party: str | None = None) -> None:
    """Raise ValueError naming the offending field if ``record`` is not a valid round record.

    With ``party`` given, ``record["party"]`` must equal it.
    """
    _validate_structure(record)
    assert isinstance(record, Mapping)
    if party is not None and record["party"] != party:
        raise ValueError(f"record.party is {record['party']!r} but this report is for party {party!r}")
    _check_jsonable(record, "record")


# --------------------------------------------------------------------------------------------------
# reading


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")


def load_round_records(party_dir: str | os.PathLike) -> list[dict]:
    """All readable round records under ``party_dir`` (``round_*/audit.json``), sorted by round.

    A corrupt, unreadable, invalid or misplaced ``audit.json`` is skipped with a logged warning.
    """
    return _load_round_records(Path(party_dir), None)


def _load_round_records(party_dir: Path, cache: dict | None) -> list[dict]:
    """``load_round_records`` with an optional parse cache keyed by path and (inode, mtime, size).

    Every write goes through os.replace, so a rewritten file always has a new inode: a cached entry is
    only reused for the very same file.
    """
    try:
        entries = list(party_dir.iterdir())
    except FileNotFoundError:
        return []
    records = []
    seen = set()
    for d in entries:
        if not _ROUND_DIR_RE.match(d.name) or not d.is_dir():
            continue
        path = d / "audit.json"
        try:
            st = path.stat()
        except FileNotFoundError:
            logger.debug("round directory without audit.json (write interrupted?): %s", d)
            continue
        except OSError as e:
            logger.warning("skipping unreadable round record %s: %s", path, e)
            continue
        key = (st.st_ino, st.st_mtime_ns, st.st_size)
        seen.add(path)
        if cache is not None and path in cache and cache[path][0] == key:
            records.append(cache[path][1])
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"), parse_constant=_reject_constant)
            _validate_structure(record)
        except (OSError, ValueError, RecursionError) as e:  # JSONDecodeError/UnicodeDecodeError are ValueErrors
            logger.warning("skipping unreadable round record %s: %s", path, e)
            continue
        if d.name != round_dir_name(record["round"]):
            logger.warning(
                "skipping round record %s: it is for round %s (expected in %s)",
                path, record["round"], round_dir_name(record["round"]),
            )
            continue
        if cache is not None:
            cache[path] = (key, record)
        records.append(record)
    if cache is not None:
        for path in set(cache) - seen:
            del cache[path]
    records.sort(key=lambda r: r["round"])
    return records


# --------------------------------------------------------------------------------------------------
# small helpers


def _ordered_models(models: Iterable[str]) -> list[str]:
    models = set(models)
    return [m for m in MODEL_ORDER if m in models] + sorted(models - set(MODEL_ORDER))


def _model_style(model: str) -> tuple[str, str]:
    return _MODEL_STYLES.get(model, _OTHER_MODEL_STYLE)


def _signal_color(signal: str) -> str:
    color = _SIGNAL_COLORS.get(signal)
    if color is None:  # stable across processes and runs (unlike hash())
        color = _EXTRA_COLORS[zlib.crc32(signal.encode("utf-8")) % len(_EXTRA_COLORS)]
    return color


def _float_or_nan(value: Any) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return math.nan
    return f if math.isfinite(f) else math.nan


def _curve(result: Mapping) -> tuple[np.ndarray, np.ndarray]:
    """(fpr, tpr) points with None/invalid dropped, sorted by fpr then tpr."""
    fpr = np.array([_float_or_nan(v) for v in result.get("fpr") or []], dtype=float)
    tpr = np.array([_float_or_nan(v) for v in result.get("tpr") or []], dtype=float)
    if fpr.shape != tpr.shape:
        return np.empty(0), np.empty(0)
    keep = np.isfinite(fpr) & np.isfinite(tpr)
    fpr, tpr = fpr[keep], tpr[keep]
    order = np.lexsort((tpr, fpr))
    return fpr[order], tpr[order]


def _auc_of(result: Mapping) -> float:
    """Privacy Meter's grid AUC ("auc"); from the grid curve if it is missing."""
    auc = _float_or_nan(result.get("auc"))
    if math.isnan(auc):
        fpr, tpr = _curve(result)
        if fpr.size >= 2:
            auc = float(np.trapezoid(tpr, fpr))
    return auc


def _exact_auc_of(result: Mapping) -> float:
    """The members-vs-non-members AUC over every threshold ("exact_auc"); NaN for records written before it
    existed (the grid curve cannot give it)."""
    return _float_or_nan(result.get("exact_auc"))


def _tpr_at(result: Mapping, tol: float) -> float:
    """TPR at FPR tolerance ``tol``: the attack's own ``tpr_at_fpr`` entry (keys are f"{tol:g}"
    strings), else the best TPR on the curve with FPR <= tol."""
    table = result.get("tpr_at_fpr")
    if isinstance(table, Mapping):
        for key, value in table.items():
            try:
                k = float(key)
            except (TypeError, ValueError):
                continue
            if math.isclose(k, tol, rel_tol=1e-9, abs_tol=1e-15):
                return _float_or_nan(value)
    fpr, tpr = _curve(result)
    ok = fpr <= tol * (1 + 1e-9)
    return float(tpr[ok].max()) if ok.any() else math.nan


def _as_tolerance_list(value: Any) -> list[float]:
    if value is None:
        return []
    if isinstance(value, (list, tuple)):
        items = value
    else:
        items = [value]
    out = []
    for v in items:
        f = _float_or_nan(v)
        if 0.0 < f <= 1.0:
            out.append(f)
    return out


def _tolerances(records: list[dict]) -> list[float]:
    """FPR tolerances from the records' settings ("fpr_tolerance"); else from the attack results."""
    tols: set[float] = set()
    for r in records:
        settings = r.get("settings") or {}
        if isinstance(settings, Mapping):
            tols.update(_as_tolerance_list(settings.get("fpr_tolerance")))
    if not tols:
        for r in records:
            for per_signal in r["attacks"].values():
                for result in per_signal.values():
                    tols.update(_as_tolerance_list(result.get("tolerances")))
    # collapse float noise so 0.1 and 0.1000000001 give one file
    by_name = {f"{t:g}": t for t in sorted(tols)}
    return sorted(by_name.values())


def _series_keys(records: list[dict]) -> list[tuple[str, str]]:
    pairs = {(m, s) for r in records for m, per in r["attacks"].items() for s in per}
    order = {m: i for i, m in enumerate(_ordered_models(m for m, _ in pairs))}
    return sorted(pairs, key=lambda p: (order[p[0]], p[1]))


def _fmt(value: Any, digits: int = 4) -> str:
    f = _float_or_nan(value)
    if math.isnan(f):
        return "–"
    if _is_int(value):
        return str(value)
    return f"{f:.{digits}g}"


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, str):  # text (e.g. a name from a plan); a number below stays a number, sign and all
        return spreadsheet_safe(value)
    if _is_int(value):
        return str(int(value))
    return repr(float(value))  # shortest string that round-trips exactly


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _href(*parts: str) -> str:
    return _e("/".join(quote(p) for p in parts))


# --------------------------------------------------------------------------------------------------
# plots


def _log_floor(values: Iterable[np.ndarray], counts: Iterable[Any] = ()) -> float:
    """Lower axis limit for log axes: half the smallest positive rate shown (or 1/n), >= 1e-6."""
    smallest = 1.0
    for v in values:
        pos = v[v > 0]
        if pos.size:
            smallest = min(smallest, float(pos.min()))
    for n in counts:
        if _is_int(n) and n > 0:
            smallest = min(smallest, 1.0 / n)
    if smallest >= 1.0:
        smallest = 1e-2
    return max(smallest / 2.0, 1e-6)


def _plot_roc(record: Mapping, path: Path, log_scale: bool) -> None:
    attacks = record["attacks"]
    models = [m for m in _ordered_models(attacks) if attacks[m]]
    n = max(1, len(models))
    width, height = 3.9 * n + 0.3, 4.5
    fig = Figure(figsize=(width, height), dpi=DPI)
    # Fixed margins (in inches) instead of constrained layout: about half the drawing time.
    fig.subplots_adjust(left=0.65 / width, right=1 - 0.15 / width, bottom=0.5 / height, top=1 - 0.95 / height,
                        wspace=0.3)
    axes = fig.subplots(1, n, squeeze=False)[0]
    for ax, model in zip(axes, models):
        per_signal = attacks[model]
        curves = {s: _curve(per_signal[s]) for s in sorted(per_signal)}
        counts = []
        for res in per_signal.values():
            counts += [res.get("n_members"), res.get("n_nonmembers")]
        floor = _log_floor([c for pair in curves.values() for c in pair], counts) if log_scale else 0.0
        for signal, (fpr, tpr) in curves.items():
            grid_auc, exact_auc = _auc_of(per_signal[signal]), _exact_auc_of(per_signal[signal])
            label = f"{signal} (grid AUC {_fmt(grid_auc, 3) if not math.isnan(grid_auc) else 'n/a'}"
            label += f", exact {_fmt(exact_auc, 3)})" if not math.isnan(exact_auc) else ")"
            if fpr.size == 0:
                ax.plot([], [], color=_signal_color(signal), label=label + " – no curve")
                continue
            if log_scale:
                fpr, tpr = np.clip(fpr, floor, 1.0), np.clip(tpr, floor, 1.0)
            ax.plot(fpr, tpr, color=_signal_color(signal), linewidth=1.6, label=label,
                    marker="." if fpr.size <= 30 else None)
        lo = floor if log_scale else 0.0
        ax.plot([lo, 1.0], [lo, 1.0], label="chance", **_CHANCE_STYLE)
        if log_scale:
            ax.set_xscale("log")
            ax.set_yscale("log")
        ax.set_xlim(lo, 1.0)
        ax.set_ylim(lo, 1.02 if not log_scale else 1.0)
        if not log_scale:
            ax.set_aspect("equal", adjustable="box")
        ax.grid(True, alpha=0.25, which="major")
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
        first = next(iter(per_signal.values()))
        sizes = ""
        if _is_int(first.get("n_members")) and _is_int(first.get("n_nonmembers")):
            sizes = f"\n{first['n_members']} members / {first['n_nonmembers']} non-members"
        ax.set_title(_MODEL_TITLES.get(model, model) + sizes, fontsize=10)
        ax.legend(loc="lower right", fontsize=8, framealpha=0.85)
    if not models:
        ax = axes[0]
        ax.text(0.5, 0.5, "no attack results in this round", ha="center", va="center", transform=ax.transAxes)
        ax.set_xlabel("False positive rate")
        ax.set_ylabel("True positive rate")
    scale = " (log-log)" if log_scale else ""
    fig.suptitle(f"{record['party']} – round {record['round']}: membership-inference ROC{scale}", fontsize=11)
    atomic_savefig(fig, path, dpi=DPI)


def _plot_per_round(
    records: list[dict], path: Path, *, party: str, value_of, ylabel: str, title: str,
    chance: float, chance_label: str, log_y: bool = False,
) -> None:
    rounds = [r["round"] for r in records]
    fig = Figure(figsize=(8.4, 4.4), dpi=DPI)
    fig.subplots_adjust(left=0.08, right=0.75, bottom=0.12, top=0.91)
    ax = fig.add_subplot()
    all_values = []
    for model, signal in _series_keys(records):
        ys = []
        for r in records:
            res = r["attacks"].get(model, {}).get(signal)
            ys.append(value_of(res) if isinstance(res, Mapping) else math.nan)
        ys = np.array(ys, dtype=float)
        all_values.append(ys[np.isfinite(ys)])
        linestyle, marker = _model_style(model)
        ax.plot(rounds, ys, linestyle=linestyle, marker=marker, markersize=5, linewidth=1.5,
                color=_signal_color(signal), label=f"{model} / {signal}")
    ax.axhline(chance, label=chance_label, **_CHANCE_STYLE)
    finite = np.concatenate(all_values) if all_values else np.empty(0)
    if log_y:
        floor = _log_floor([finite, np.array([chance])])
        for line in ax.get_lines():
            y = np.asarray(line.get_ydata(), dtype=float)
            line.set_ydata(np.where(np.isfinite(y), np.clip(y, floor, None), np.nan))
        ax.set_yscale("log")
        ax.set_ylim(floor, 1.05)
    else:
        lo = min([chance - 0.05] + ([float(finite.min()) - 0.05] if finite.size else []))
        hi = max([chance + 0.05] + ([float(finite.max()) + 0.05] if finite.size else []))
        ax.set_ylim(max(lo, -0.02), min(hi, 1.02))
    if len(rounds) == 1:
        ax.set_xlim(rounds[0] - 1, rounds[0] + 1)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(True, alpha=0.25)
    ax.set_xlabel("Round")
    ax.set_ylabel(ylabel)
    ax.set_title(f"{party}: {title}", fontsize=11)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, title="model / signal",
              title_fontsize=8)
    atomic_savefig(fig, path, dpi=DPI)


# --------------------------------------------------------------------------------------------------
# HTML

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5em auto;max-width:1300px;
 padding:0 1em;color:#222}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em;border-bottom:1px solid #ddd}h3{font-size:1.05em}
img{max-width:100%;height:auto;border:1px solid #eee}
table{border-collapse:collapse;font-size:.82em}th,td{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#f4f4f4;white-space:nowrap}td:first-child,th:first-child{text-align:left;position:sticky;left:0;
 background:#fafafa}.scroll{overflow-x:auto;max-width:100%}
section.round{margin:1.2em 0;padding-top:.4em;border-top:1px dashed #ccc}.muted{color:#777;font-size:.9em}
pre{background:#f7f7f7;padding:.6em;overflow-x:auto;font-size:.8em}
""".strip()


def _page(title: str, body: list[str]) -> str:
    return "\n".join([
        "<!DOCTYPE html>",
        '<html lang="en">',
        "<head>",
        '<meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{_e(title)}</title>",
        f"<style>{_CSS}</style>",
        "</head>",
        "<body>",
        *body,
        "</body>",
        "</html>",
        "",
    ])


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


_AUC_NOTE = (
    '<p class="muted">Exact AUC: members against non-members over every threshold (ties count half). Grid AUC: '
    "Privacy Meter's, the area under the curve in the ROC image, whose thresholds are population quantiles; it "
    "stops at the population's range, so it reads low on a small population. TPR @ FPR ≤ t: the threshold flags "
    "at most a share t of the population (ties are flagged whole or not at all); the non-members' FPR there is in "
    "audit.json (fpr_at_fpr).</p>"
)


def _round_section(record: Mapping, tols: list[float]) -> list[str]:
    rnd = record["round"]
    d = round_dir_name(rnd)
    out = [f'<section class="round" id="{_e(d)}">', f"<h3>Round {_e(rnd)}</h3>"]
    out.append(f'<p class="muted"><a href="{_href(d, "audit.json")}">audit.json</a>'
               + (f" · seed {_e(record['seed'])}" if record.get("seed") is not None else "") + "</p>")
    rows = []
    for model in _ordered_models(record["attacks"]):
        for signal in sorted(record["attacks"][model]):
            res = record["attacks"][model][signal]
            cells = [f"<td>{_e(model)} / {_e(signal)}</td>", f"<td>{_e(_fmt(_exact_auc_of(res)))}</td>",
                     f"<td>{_e(_fmt(_auc_of(res)))}</td>"]
            cells += [f"<td>{_e(_fmt(_tpr_at(res, t)))}</td>" for t in tols]
            cells.append(f"<td>{_e(_fmt(res.get('n_members')))} / {_e(_fmt(res.get('n_nonmembers')))}</td>")
            rows.append("<tr>" + "".join(cells) + "</tr>")
    if rows:
        head = "<tr><th>model / signal</th><th>exact AUC</th><th>grid AUC (Privacy Meter)</th>" + "".join(
            f"<th>TPR @ FPR ≤ {_e(f'{t:g}')}</th>" for t in tols) + "<th>members / non-members</th></tr>"
        out += ['<div class="scroll"><table>', head, *rows, "</table></div>", _AUC_NOTE]
    out.append(f'<p><a href="{_href(d, "roc.png")}"><img src="{_href(d, "roc.png")}" '
               f'alt="{_e(f"ROC curves, round {rnd}")}" loading="lazy"></a></p>')
    details = {k: record[k] for k in ("settings", "timings", "extra") if record.get(k)}
    if details:
        text = json.dumps(details, sort_keys=True, indent=2, default=str)
        out.append(f"<details><summary>settings, timings, extra</summary><pre>{_e(text)}</pre></details>")
    out.append("</section>")
    return out


def _party_page(party: str, records: list[dict], tols: list[float], tpr_files: list[str], log_scale: bool) -> str:
    body = ['<p><a href="../index.html">&larr; all parties</a></p>', f"<h1>Privacy audit: {_e(party)}</h1>"]
    if not records:
        body.append(f'<p>No audited rounds yet. <span class="muted">Updated {_e(_now())}.</span></p>')
        return _page(f"Privacy audit: {party}", body)
    latest = records[-1]["round"]
    body.append(
        f"<p>{len(records)} audited round{'s' if len(records) != 1 else ''} (latest: "
        f'<a href="#{_e(round_dir_name(latest))}">round {_e(latest)}</a>). '
        f'Data: <a href="metrics.csv">metrics.csv</a>. <span class="muted">Updated {_e(_now())}.</span></p>'
    )
    body += ["<h2>Membership-inference AUC per round (exact AUC)</h2>",
             '<p class="muted">Members against non-members over every threshold. Privacy Meter\'s grid AUC is in '
             "the tables: metrics ending in <code>_auc</code> are the grid AUC, those ending in "
             "<code>_exact_auc</code> the exact one.</p>",
             '<p><img src="auc.png" alt="exact AUC per round for every model and signal"></p>']
    if tpr_files:
        body.append("<h2>TPR at fixed FPR per round</h2>")
        body.append('<p class="muted">With the threshold flagging at most a share t of the population. Dotted '
                    "line: a random guess (TPR = FPR)" + ("; log-scaled TPR" if log_scale else "") + ".</p>")
        for t, name in zip(tols, tpr_files):
            body.append(f'<p><img src="{_href(name)}" alt="{_e(f"TPR at FPR {t:g} per round")}"></p>')
    names = sorted({k for r in records for k in r["metrics"]})
    body.append("<h2>Metrics per round</h2>")
    if names:
        body.append('<div class="scroll"><table>')
        body.append("<tr><th>round</th>" + "".join(f"<th>{_e(n)}</th>" for n in names) + "</tr>")
        for r in reversed(records):
            cells = "".join(
                f'<td title="{_e(_csv_cell(r["metrics"][n]))}">{_e(_fmt(r["metrics"][n]))}</td>'
                if n in r["metrics"] else "<td></td>"
                for n in names
            )
            body.append(f'<tr><td><a href="#{_e(round_dir_name(r["round"]))}">{_e(r["round"])}</a></td>{cells}</tr>')
        body.append("</table></div>")
    else:
        body.append("<p>No metrics recorded.</p>")
    body.append("<h2>Rounds (newest first)</h2>")
    for r in reversed(records):
        body += _round_section(r, tols)
    return _page(f"Privacy audit: {party}", body)


def write_index(root: str | os.PathLike) -> Path:
    """Write ``root/index.html`` linking every party report (``root/<party>/index.html``) found on disk."""
    root = Path(root)
    parties = []
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.name)
    except FileNotFoundError:
        entries = []
    for d in entries:
        if d.name.startswith(".") or not d.is_dir() or not (d / "index.html").is_file():
            continue
        rounds = sorted(
            int(m.group(1)) for c in d.iterdir()
            if (m := _ROUND_DIR_RE.match(c.name)) and (c / "audit.json").is_file()
        )
        parties.append((d.name, rounds))
    body = ["<h1>Privacy audit reports</h1>"]
    if parties:
        body.append("<table><tr><th>party</th><th>audited rounds</th><th>latest round</th></tr>")
        for name, rounds in parties:
            latest = str(rounds[-1]) if rounds else "–"
            body.append(f'<tr><td><a href="{_href(name, "index.html")}">{_e(name)}</a></td>'
                        f"<td>{len(rounds)}</td><td>{_e(latest)}</td></tr>")
        body.append("</table>")
    else:
        body.append("<p>No party reports yet.</p>")
    body.append(f'<p class="muted">Updated {_e(_now())}.</p>')
    return atomic_write_text(root / "index.html", _page("Privacy audit reports", body))


# --------------------------------------------------------------------------------------------------
# writer


class ReportWriter:
    """Writes one party's audit report under ``root/<party>/``.

    ``write_round(record)`` stores the round (``audit.json`` + ``roc.png``) and rebuilds the cross-round
    files from every ``audit.json`` on disk; all writes are atomic. One writer per party at a time;
    writers for different parties may share ``root`` (the root index is rewritten atomically by each).
    """

    def __init__(self, root: str | os.PathLike, party: str, *, log_scale: bool = False) -> None:
        self.party = validate_party_name(party)
        self.root = Path(root)
        self.party_dir: Path = self.root / party
        self.log_scale = bool(log_scale)
        self._cache: dict = {}  # parsed audit.json files (read-only use), see _load_round_records

    def round_dir(self, round_: int) -> Path:
        return self.party_dir / round_dir_name(round_)

    def write_round(self, record: dict) -> Path:
        """Validate and store one round record, then rebuild the summaries; returns the round directory.

        Raises ValueError naming the offending field for an invalid record (nothing is written).
        """
        validate_record(record, party=self.party)
        rdir = self.round_dir(record["round"])
        # The ROC image first, audit.json last: audit.json is what makes a round part of the report.
        _plot_roc(record, rdir / "roc.png", self.log_scale)
        atomic_write_json(rdir / "audit.json", record)
        self.rebuild_summary()
        return rdir

    def rebuild_summary(self) -> None:
        """Rewrite metrics.csv, auc.png, tpr_at_*.png, index.html and root/index.html from disk."""
        records = _load_round_records(self.party_dir, self._cache)
        self.party_dir.mkdir(parents=True, exist_ok=True)
        self._write_metrics_csv(records)
        tols = _tolerances(records) if records else []
        tpr_files = [f"tpr_at_{t:g}.png" for t in tols]
        if records:
            _plot_per_round(
                records, self.party_dir / "auc.png", party=self.party, value_of=_exact_auc_of,
                ylabel="exact AUC (every threshold)", title="membership-inference AUC per round (exact AUC)",
                chance=0.5, chance_label="chance (AUC 0.5)",
            )
            for t, name in zip(tols, tpr_files):
                _plot_per_round(
                    records, self.party_dir / name, party=self.party,
                    value_of=lambda res, t=t: _tpr_at(res, t),
                    ylabel=f"TPR at FPR ≤ {t:g}", title=f"TPR at FPR ≤ {t:g} per round",
                    chance=t, chance_label=f"chance (TPR = {t:g})", log_y=self.log_scale,
                )
        # Derived state: drop plots no longer backed by the records (e.g. a tolerance was removed).
        stale = [p for p in self.party_dir.glob("tpr_at_*.png") if p.name not in tpr_files]
        if not records:
            stale.append(self.party_dir / "auc.png")
        for p in stale:
            if _TPR_PLOT_RE.match(p.name) or p.name == "auc.png":
                p.unlink(missing_ok=True)
        atomic_write_text(
            self.party_dir / "index.html", _party_page(self.party, records, tols, tpr_files, self.log_scale)
        )
        write_index(self.root)

    def _write_metrics_csv(self, records: list[dict]) -> None:
        names = sorted({k for r in records for k in r["metrics"]})
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(["round", *(_csv_cell(n) for n in names)])
        for r in records:
            writer.writerow([r["round"], *(_csv_cell(r["metrics"].get(n)) for n in names)])
        atomic_write_text(self.party_dir / "metrics.csv", buf.getvalue())
