"""verl's two spellings of one setting (an older key and a newer one) resolve through one rule,
:func:`hybridrl.config.rules.two_spellings`: the one set away from its default wins; both set to
different values are one line naming both keys."""

import pytest

from hybridrl.config.rules import two_spellings
from hybridrl.errors import ConfigError


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (1.0, None, 1.0),  # neither set: the older key's value (its default)
        (0.5, None, 0.5),  # only the older set
        (1.0, 0.3, 0.3),  # only the newer set
        (0.3, 0.3, 0.3),  # both set, to the same value
    ],
)
def test_the_spelling_set_wins(old, new, expected):
    assert two_spellings("a.old", old, 1.0, "a.new", new) == expected


def test_a_newer_key_with_its_own_default():
    assert two_spellings("a.old", 1, 1, "a.new", 1, 1) == 1
    assert two_spellings("a.old", 1, 1, "a.new", 4, 1) == 4
    assert two_spellings("a.old", 2, 1, "a.new", 1, 1) == 2


def test_both_set_differently_is_one_line_naming_both():
    with pytest.raises(ConfigError) as err:
        two_spellings("a.old", 0.5, 1.0, "a.new", 0.3)
    message = str(err.value)
    assert "\n" not in message
    assert message == (
        "a.old=0.5 and a.new=0.3 are verl's two spellings of one setting, set to different values; set only a.new"
    )
