"""``DecodeConfig`` is checked when it is built, by the option tree's own checks of the sampling
options (those of ``SamplingParams``), its errors naming the field as ``DecodeConfig`` spells
it: a bad value never waits for ``decode()``."""

from __future__ import annotations

from typing import Any

import pytest

from llamapy.errors import InvalidOptionError, UnsupportedFeatureError
from llamapy.session import DecodeConfig


@pytest.mark.parametrize(("fields", "option"), [
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"top_k": -1}, "top_k"),
    ({"top_k": 2**31}, "top_k"),
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_p": "all"}, "top_p"),
    ({"seed": 1.0}, "seed"),
    ({"seed": -2}, "seed"),
    ({"seed": 2**32}, "seed"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"parser_protocols": "think"}, "parser_protocols"),
    ({"parser_protocols": ("think", 3)}, "parser_protocols"),
])
def test_a_bad_field_raises_when_the_config_is_built(fields: dict[str, Any],
                                                     option: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        DecodeConfig(**fields)
    assert info.value.option == option and str(info.value).startswith(option)


def test_an_unknown_parser_protocol_raises_when_the_config_is_built() -> None:
    with pytest.raises(UnsupportedFeatureError) as info:
        DecodeConfig(parser_protocols=("think", "no-such-protocol"))
    assert info.value.feature == "no-such-protocol"


def test_good_fields_build_and_keep_their_values() -> None:
    config = DecodeConfig(temperature=0, top_k=0, top_p=1.0, seed=-1, max_tokens=0,
                          parser_protocols=["think"])
    assert (config.temperature, config.top_k, config.top_p, config.seed) == (0, 0, 1.0, -1)
    assert config.parser_protocols == ("think",)
