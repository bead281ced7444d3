"""Round records of a report folder: their names, their validation, and reading them all back.

Two layouts: a party's report keeps each round in a folder (``round_0003/audit.json``, see
audit.reporting.party), the aggregator's and the deanonymization reports keep ``round_0003.json`` files. Summaries
are always rebuilt from these files, so a crash mid-run leaves every earlier round's record usable.
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import os
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from audit.config.fields import is_int
from audit.config.vocabulary import FIDEL_GRID_FILE, RMIA_SCORES_FILE, SIGNALS_FILE  # noqa: F401 (re-exported)

__all__ = ["validate_party_name", "round_dir_name", "validate_record", "validate_structure", "load_round_records",
           "load_cached_round_records", "round_file_name", "load_round_files", "ROUND_DIR_RE", "SIGNALS_FILE",
           "RMIA_SCORES_FILE", "FIDEL_GRID_FILE", "HISTOGRAMS_FILE"]

logger = logging.getLogger(__name__)

_SAFE_PARTY_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._@+-]{0,127}$")
ROUND_DIR_RE = re.compile(r"^round_(\d+)$")
HISTOGRAMS_FILE = "signals.png"       # the members' and non-members' signal histograms (audit.reporting.plots)
_TPR_PLOT_RE = re.compile(r"^tpr_at_.+\.png$")




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


def is_finite_number(value: object) -> bool:
    return (
        isinstance(value, numbers.Real)
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _sub(where: str, key: str) -> str:
    return f"{where}.{key}" if key.isidentifier() else f"{where}[{key!r}]"


def validate_structure(record: object) -> None:
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
    if not is_int(record["round"]) or record["round"] < 0:
        raise ValueError(f"record.round must be an int >= 0, got {record['round']!r}")
    if "seed" in record and record["seed"] is not None and not is_int(record["seed"]):
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
        if not is_finite_number(value):
            raise ValueError(f"{_sub('record.metrics', name)} must be a finite number, got {value!r}")


def _validate_attack(result: object, where: str) -> None:
    if not isinstance(result, Mapping):
        raise ValueError(f"{where} must be an attack-result dict, got {type(result).__name__}")
    for key in ("auc", "exact_auc"):
        auc = result.get(key)
        if auc is not None and not is_finite_number(auc):
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
                if not is_finite_number(v) or not 0.0 <= float(v) <= 1.0:
                    raise ValueError(f"{where}.{key}[{i}] must be a rate in [0, 1] (or None), got {v!r}")
            lengths.append(len(values))
        if lengths[0] != lengths[1]:
            raise ValueError(f"{where}: fpr and tpr lengths differ ({lengths[0]} != {lengths[1]})")
    tpr_at = result.get("tpr_at_fpr")
    if tpr_at is not None and not isinstance(tpr_at, Mapping):
        raise ValueError(f"{where}.tpr_at_fpr must be a dict, got {type(tpr_at).__name__}")


def check_jsonable(value: Any, where: str) -> None:
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
            check_jsonable(v, _sub(where, k))
        return
    if isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            check_jsonable(v, f"{where}[{i}]")
        return
    if isinstance(value, (np.ndarray, np.generic)):
        check_jsonable(value.tolist(), where)
        return
    raise ValueError(f"{where} is not JSON-serialisable ({type(value).__name__})")


def validate_record(record: object, party: str | None = None) -> None:
    """Raise ValueError naming the offending field if ``record`` is not a valid round record.

    With ``party`` given, ``record["party"]`` must equal it.
    """
    validate_structure(record)
    assert isinstance(record, Mapping)
    if party is not None and record["party"] != party:
        raise ValueError(f"record.party is {record['party']!r} but this report is for party {party!r}")
    check_jsonable(record, "record")




def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} in JSON")


def load_round_records(party_dir: str | os.PathLike) -> list[dict]:
    """All readable round records under ``party_dir`` (``round_*/audit.json``), sorted by round.

    A corrupt, unreadable, invalid or misplaced ``audit.json`` is skipped with a logged warning.
    """
    return load_cached_round_records(Path(party_dir), None)


def load_cached_round_records(party_dir: Path, cache: dict | None) -> list[dict]:
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
        if not ROUND_DIR_RE.match(d.name) or not d.is_dir():
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
            validate_structure(record)
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


_ROUND_FILE_RE = re.compile(r"^round_(\d{4,})\.json$")


def round_file_name(round_num: int) -> str:
    return f"round_{int(round_num):04d}.json"


def load_round_files(root: str | Path, what: str) -> list[dict]:
    """The readable round records under `root`, by round; unreadable or misnamed ones are logged and skipped."""
    records = []
    for path in sorted(Path(root).glob("round_*.json")):
        match = _ROUND_FILE_RE.match(path.name)
        if not match:
            continue
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            logger.warning("skipping unreadable %s record %s: %s", what, path, err)
            continue
        if not isinstance(record, dict) or record.get("round") != int(match.group(1)):
            logger.warning("skipping %s record %s: not the record of its round", what, path)
            continue
        records.append(record)
    return sorted(records, key=lambda r: r["round"])
