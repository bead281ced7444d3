"""audit.config.fields, the one settings idiom, on settings classes made up here: each builder's types and bounds
(both sides of each bound, open and closed), composition, the messages (always SettingsError, always the dotted key
first), "did you mean", nested sections' dotted keys, cross-field rules, round trips and the reference rows."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from audit.config.fields import (Mismatch, SettingsError, boolean, check_fields, choice, choices, custom, either,
                                 integer, literal, mapping, module_name, optional, parse, path, real, section,
                                 setting, subsection, to_dict)
from audit.config.reference import reference_rows, yaml_text

KEY = "plan.thing"


def refused(check, value) -> str:
    with pytest.raises(SettingsError) as err:
        check(KEY, value)
    assert isinstance(err.value, ValueError)
    message = str(err.value)
    assert message.startswith(f"{KEY}: "), message
    return message


# ------------------------------------------------------------------------------------------------ builders


def test_boolean_takes_only_booleans():
    check = boolean()
    assert check(KEY, True) is True and check(KEY, np.bool_(False)) is False
    for bad in (1, 0, "true", None, 1.0):
        assert refused(check, bad) == f"{KEY}: expected true or false, got {bad!r}"


@pytest.mark.parametrize("low, high, inside, outside, text", [
    (1, None, [1, 2, 10**12], [0, -1], "an integer >= 1"),
    (0, None, [0, 5], [-1], "an integer >= 0"),
    (None, 5, [5, -3], [6], "an integer <= 5"),
    (1, 3600, [1, 3600], [0, 3601], "an integer in [1, 3600]"),
    (None, None, [-7, 0, 7], [], "an integer"),
])
def test_integer_bounds_are_closed_on_both_sides(low, high, inside, outside, text):
    check = integer(min=low, max=high)
    assert check.describe() == text
    for value in inside:
        assert check(KEY, value) == value and type(check(KEY, value)) is int
    assert check(KEY, np.int64(inside[0])) == inside[0]
    for value in outside:
        assert refused(check, value) == f"{KEY}: expected {text}, got {value}"


@pytest.mark.parametrize("bad", [1.0, 2.5, "3", True, np.bool_(True), None, [1]])
def test_integer_refuses_every_other_type(bad):
    assert "expected an integer >= 1" in refused(integer(min=1), bad)


@pytest.mark.parametrize("bounds, text, inside, outside", [
    (dict(gt=0), "a finite number > 0", [1e-300, 1, 2.5], [0, -1e-300, math.inf]),
    (dict(ge=0), "a finite number >= 0", [0, 0.0, 3], [-1e-9, math.inf]),
    (dict(lt=1), "a finite number < 1", [0.999, -5], [1, -math.inf]),
    (dict(le=1), "a finite number <= 1", [1, -5], [1.0000001]),
    (dict(gt=0, le=1), "a number in (0, 1]", [1e-9, 1], [0, 1.0000001]),
    (dict(ge=0.5, lt=1), "a number in [0.5, 1)", [0.5, 0.999], [0.4999, 1]),
    (dict(gt=0, lt=1), "a number in (0, 1)", [0.5], [0, 1]),
    (dict(ge=0, le=1), "a number in [0, 1]", [0, 1], [-0.1, 1.1]),
    (dict(), "a finite number", [-1e300, 0, 1e300], [math.inf, -math.inf]),
])
def test_real_bounds_open_and_closed(bounds, text, inside, outside):
    check = real(**bounds)
    assert check.describe() == text
    for value in inside:
        assert check(KEY, value) == value and type(check(KEY, value)) is float
    for value in outside:
        assert refused(check, value) == f"{KEY}: expected {text}, got {value!r}"


def test_real_refuses_nan_bools_and_strings_and_may_take_infinity():
    for bad in (math.nan, True, np.bool_(False), "0.5", None):
        refused(real(gt=0), bad)
    unbounded = real(gt=0, finite=False, noun="a number of seconds", note=".inf: no cutoff")
    assert unbounded.describe() == "a number of seconds > 0 (.inf: no cutoff)"
    assert unbounded(KEY, math.inf) == math.inf
    refused(unbounded, math.nan)
    refused(unbounded, -math.inf)
    with pytest.raises(TypeError):
        real(gt=0, ge=0)


def test_choice_names_the_unknown_value_and_the_nearest_name():
    check = choice(("linear_itp", "gaussian"), "threshold function")
    assert check(KEY, "gaussian") == "gaussian" and check.describe() == "one of linear_itp, gaussian"
    assert refused(check, "gausian") == (f"{KEY}: unknown threshold function 'gausian'; known: linear_itp, gaussian; "
                                         "did you mean gaussian?")
    assert refused(check, "magic") == f"{KEY}: unknown threshold function 'magic'; known: linear_itp, gaussian"
    assert refused(check, None).endswith("None; known: linear_itp, gaussian")
    assert refused(check, "Gaussian").endswith("did you mean gaussian?")  # exact case unless asked
    folded = choice(("digits", "mnist"), "dataset", fold=True)
    assert folded(KEY, "  MNIST ") == "mnist"
    assert refused(choice(("grpc", "rest")), "http") == f"{KEY}: expected one of grpc, rest, got 'http'"


def test_choices_is_a_non_empty_list_of_distinct_names():
    check = choices(("loss", "logits", "gradient_norm"), "signal")
    assert check(KEY, ["logits", "loss"]) == ("logits", "loss")
    assert check(KEY, ("loss",)) == ("loss",)
    for bad in ([], "loss", {"loss": 1}, None):
        assert refused(check, bad).startswith(f"{KEY}: expected a non-empty list from loss, logits, gradient_norm")
    assert refused(check, ["loss", "los"]) == (f"{KEY}: unknown signal 'los'; known: loss, logits, gradient_norm; "
                                               "did you mean loss?")
    assert refused(check, [1]) == f"{KEY}: unknown signal 1; known: loss, logits, gradient_norm"
    assert refused(check, ["loss", "loss"]) == f"{KEY}: signal 'loss' is listed twice"
    assert choices(("a", "b"), "x", one_ok=True)(KEY, "b") == ("b",)


def test_optional_either_and_literal_compose_and_say_what_they_take_as_a_whole():
    sample = optional(integer(min=2, note="samples per set"), "every sample")
    assert sample(KEY, None) is None and sample(KEY, 2) == 2
    assert sample.describe() == "an integer >= 2 (samples per set) or null (every sample)"
    assert refused(sample, 1) == f"{KEY}: expected an integer >= 2 (samples per set) or null (every sample), got 1"
    alpha = either(literal("federation"), real(gt=0, noun="a Dirichlet alpha"), literal(None, "IID"))
    assert alpha.describe() == "'federation', a Dirichlet alpha > 0 or null (IID)"
    assert alpha(KEY, "federation") == "federation" and alpha(KEY, 2) == 2.0 and alpha(KEY, None) is None
    assert refused(alpha, "fed") == f"{KEY}: expected 'federation', a Dirichlet alpha > 0 or null (IID), got 'fed'"
    assert refused(alpha, 0) == f"{KEY}: expected 'federation', a Dirichlet alpha > 0 or null (IID), got 0"
    # a message of an inner check's own (not a plain mismatch) is kept
    listed = optional(choices(("a", "b"), "kind"))
    assert refused(listed, ["a", "a"]) == f"{KEY}: kind 'a' is listed twice"
    assert literal(1)(KEY, 1) == 1
    refused(literal(1), True)  # True == 1 in Python; not the same value in a plan


def test_strings_paths_modules_mappings_and_custom_checks():
    assert module_name()(KEY, " classifier.0 ") == "classifier.0"
    for bad in ("", "  ", 3, None):
        assert refused(module_name(), bad).startswith(f"{KEY}: expected a module name")
    assert path()(KEY, Path("a/b")) == "a/b"
    for bad in ("", " ", "a\0b", 5, ["reports"]):
        assert refused(path(), bad).startswith(f"{KEY}: expected a folder path, got")
    numbers = mapping(real(ge=0), key_name="<metric>")
    assert numbers(KEY, None) == {} and numbers(KEY, {"a": 1}) == {"a": 1.0}
    with pytest.raises(SettingsError, match=rf"^{KEY}\.b: expected a finite number >= 0, got -1$"):
        numbers(KEY, {"a": 1, "b": -1})
    assert refused(numbers, [1]).startswith(f"{KEY}: expected a mapping of <metric> -> a finite number >= 0")
    assert refused(numbers, {"": 1}).startswith(f"{KEY}: names must be non-empty strings")

    def even(_key, value):
        if not isinstance(value, int) or value % 2:
            raise Mismatch
        return value
    check = custom("an even integer", even)
    assert check(KEY, 4) == 4 and refused(check, 3) == f"{KEY}: expected an even integer, got 3"


# ------------------------------------------------------------------------------------------------ classes


@dataclass(frozen=True)
class Inner:
    """A made-up nested section."""

    rate: float = setting(0.5, real(gt=0, le=1), "a share")
    names: tuple[str, ...] = setting(("x",), choices(("x", "y", "z"), "name"), "which names")


@dataclass(frozen=True)
class Outer:
    enabled: bool = setting(False, boolean(), "on or off")
    count: int | None = setting(None, optional(integer(min=1), "as many as there are"), "how many")
    inner: Inner = subsection(Inner, "the nested section")
    later: dict | None = setting(None, section(Inner, later=True), "parsed by its owner")
    each: dict = setting({}, mapping(section(Inner), key_name="<party>"), "one Inner per party")

    @staticmethod
    def validate(values, key, given):
        if values["enabled"] and values["count"] is None:
            raise SettingsError(f"{key}.count: needed when enabled{'' if 'count' in given else ' (not set)'}")


def test_parse_gives_defaults_and_checks_each_given_value():
    assert parse(Outer, None, "a.outer") == Outer() == parse(Outer, {}, "a.outer")
    got = parse(Outer, {"count": 3, "inner": {"rate": 1, "names": ["z", "y"]}, "each": {"p1": {"rate": 0.25}}},
                "a.outer")
    assert got.count == 3 and got.inner == Inner(rate=1.0, names=("z", "y"))
    assert got.each == {"p1": Inner(rate=0.25)}
    assert parse(Outer, got, "a.outer") is got  # an instance as it is
    assert Outer().each is not Outer().each  # a mutable default is per instance


def test_nested_sections_are_named_by_their_full_dotted_key():
    cases = [
        ({"inner": {"rate": 0}}, "a.outer.inner.rate: expected a number in (0, 1], got 0"),
        ({"inner": {"names": ["w"]}}, "a.outer.inner.names: unknown name 'w'; known: x, y, z"),
        ({"inner": {"rte": 0.5}}, "a.outer.inner.rte: unknown setting; known: rate, names; did you mean rate?"),
        ({"inner": 5}, "a.outer.inner: expected a mapping of settings (rate, names), got 5"),
        ({"each": {"p2": {"rate": 2}}}, "a.outer.each.p2.rate: expected a number in (0, 1], got 2"),
        ({"each": {"p2": 7}}, "a.outer.each.p2: expected a mapping of settings (rate, names), got 7"),
        ({"later": 3}, "a.outer.later: expected a mapping of settings, got 3"),
        ({"enabld": True}, "a.outer.enabld: unknown setting; known: enabled, count, inner, later, each; "
                           "did you mean enabled?"),
        ("on", "a.outer: expected a mapping of settings (enabled, count, inner, later, each), got 'on'"),
    ]
    for value, message in cases:
        with pytest.raises(SettingsError) as err:
            parse(Outer, value, "a.outer")
        assert str(err.value) == message


def test_a_later_section_is_kept_as_given_for_its_owner():
    assert parse(Outer, {"later": {"rate": 9}}, "k").later == {"rate": 9}  # its owner parses it, with its key
    assert parse(Outer, {}, "k").later is None


def test_unknown_keys_without_a_close_name_list_the_known_ones_only():
    with pytest.raises(SettingsError) as err:
        parse(Inner, {"zzz": 1}, "k")
    assert str(err.value) == "k.zzz: unknown setting; known: rate, names"
    with pytest.raises(SettingsError, match=r"^k\.zzz: unknown setting; known: rate, names, audit$"):
        parse(Inner, {"zzz": 1}, "k", also=("audit",))


def test_cross_field_rules_see_defaults_and_which_keys_were_given():
    with pytest.raises(SettingsError, match=r"^a\.count: needed when enabled \(not set\)$"):
        parse(Outer, {"enabled": True}, "a")
    with pytest.raises(SettingsError, match=r"^a\.count: needed when enabled$"):
        parse(Outer, {"enabled": True, "count": None}, "a")
    assert parse(Outer, {"enabled": True, "count": 1}, "a").count == 1


def test_to_dict_round_trips_through_json_and_check_fields_normalises_in_place():
    value = parse(Outer, {"count": 2, "inner": {"names": ["y"]}, "each": {"p": {"rate": 1}}}, "a")
    plain = to_dict(value)
    assert plain == {"enabled": False, "count": 2, "inner": {"rate": 0.5, "names": ["y"]}, "later": None,
                     "each": {"p": {"rate": 1.0, "names": ["x"]}}}
    assert parse(Outer, json.loads(json.dumps(plain)), "a") == value
    direct = Inner(rate=1, names=["x"])
    check_fields(direct, "direct")
    assert direct == Inner(rate=1.0, names=("x",)) and type(direct.rate) is float
    with pytest.raises(SettingsError, match=r"^direct\.rate: "):
        check_fields(Inner(rate=0), "direct")


def test_reference_rows_describe_every_key_once():
    rows = {key: (takes, default, doc) for key, takes, default, doc in reference_rows(Outer, "a")}
    assert rows["a.count"] == ("an integer >= 1 or null (as many as there are)", "null", "how many")
    assert rows["a.inner"] == ("a section", "", "the nested section")
    assert rows["a.inner.rate"] == ("a number in (0, 1]", "0.5", "a share")
    assert rows["a.inner.names"][1] == "[x]"
    # the same class again is referred to, not listed again
    assert rows["a.later"] == ("a section: the keys of a.inner", "", "parsed by its owner")
    assert "a.later.rate" not in rows
    assert rows["a.each"][0] == "a mapping of <party> -> a section"
    assert rows["a.each.<party>"][0] == "a section: the keys of a.inner"
    assert yaml_text(1e-5) == "1.0e-05" and yaml_text(("a", None, True)) == "[a, null, true]"
