"""The options every windowed rule shares (psserver.core.rules._windowed): DyLU's switch, h_min and v_ref."""

from __future__ import annotations

import pytest

from psserver.core.rules import RULES, RuleOptionError, RuleSpec
from psserver.core.rules._windowed import DYLU_OPTIONS, WindowedOptions

WINDOWED = ("agn", "diloco", "diloco-dn", "downpour", "dynsgd", "eamsgd", "easgd")


def test_every_windowed_rule_takes_dylu_off_by_default() -> None:
    windowed = sorted(name for name, rule in RULES.items() if issubclass(rule.options_type, WindowedOptions))
    assert tuple(windowed) == WINDOWED
    for name in WINDOWED:
        options = RuleSpec.parse(name, {}).options
        assert isinstance(options, WindowedOptions)
        assert (options.dylu, options.dylu_min, options.dylu_ref) == (False, 1, "max")
        on = RuleSpec.parse(name, {"dylu": "true", "dylu_min": "2", "dylu_ref": "p90"}).options
        assert isinstance(on, WindowedOptions) and (on.dylu, on.dylu_min, on.dylu_ref) == (True, 2, "p90")
        # The worker is told its steps in every push reply, not DyLU's options.
        sent = RuleSpec.parse(name, {"dylu": "true"}).build(6).procedure_options()
        assert "window" in sent and not DYLU_OPTIONS & set(sent)


@pytest.mark.parametrize("rule", sorted(set(RULES) - set(WINDOWED)))
def test_dylu_on_a_rule_without_local_steps_is_a_clear_error(rule: str) -> None:
    with pytest.raises(RuleOptionError, match=r"option dylu \(DyLU\) needs a windowed rule.*push every step"):
        RuleSpec.parse(rule, {"dylu": "true"})
    with pytest.raises(RuleOptionError, match=r"option dylu_min \(DyLU\) needs a windowed rule"):
        RuleSpec.parse(rule, {"dylu_min": "2"})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"dylu_min": "0"}, r"option dylu_min=0 is out of range: value >= 1"),
        ({"dylu_min": "-3"}, r"option dylu_min=-3 is out of range"),
        ({"dylu_min": "9", "window": "8"}, r"dylu_min=9 is out of range: 1 <= dylu_min <= window = 8"),
        ({"dylu_ref": "p50"}, r"option dylu_ref='p50' must be one of max, p90"),
        ({"dylu": "maybe"}, r"option dylu='maybe' is not a valid bool"),
    ],
)
def test_bad_dylu_options_are_refused(options: dict[str, str], message: str) -> None:
    with pytest.raises(RuleOptionError, match=message):
        RuleSpec.parse("diloco-dn", options)
