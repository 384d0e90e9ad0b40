"""Submission keys (gridcore.sites.keys): pure builders and the parser that names the
holder back, table-driven."""

from __future__ import annotations

import pytest

from gridcore.model import HolderKind
from gridcore.sites.keys import (
    KeyHolder,
    component_key,
    install_prefix,
    is_valid_key,
    parse_key,
    probe_key,
    selection_key,
)

INSTALL = "0123456789ab"


@pytest.mark.parametrize(
    ("key", "holder"),
    [
        (selection_key(INSTALL, 42), KeyHolder(INSTALL, HolderKind.SELECTION, (42,))),
        (component_key(INSTALL, 7, 3, 1), KeyHolder(INSTALL, HolderKind.COMPONENT, (7, 3, 1))),
        (
            probe_key(INSTALL, "local-a", "9f0e"),
            KeyHolder(INSTALL, HolderKind.PROBE, site="local-a", token="9f0e"),
        ),
        (
            probe_key(INSTALL, "x-1_2", "00"),
            KeyHolder(INSTALL, HolderKind.PROBE, site="x-1_2", token="00"),
        ),
    ],
    ids=["selection", "component", "probe", "probe-site-with-dashes"],
)
def test_every_key_names_its_holder_back(key: str, holder: KeyHolder) -> None:
    assert key.startswith(install_prefix(INSTALL))
    assert is_valid_key(key)
    assert parse_key(key) == holder


def test_the_formats_are_the_documented_ones() -> None:
    assert selection_key(INSTALL, 42) == "gc-0123456789ab-s42"
    assert component_key(INSTALL, 7, 3, 1) == "gc-0123456789ab-c7-3-1"
    assert probe_key(INSTALL, "beta", "abc") == "gc-0123456789ab-pbeta-abc"


@pytest.mark.parametrize(
    "key",
    [
        "",
        "user-job",
        "gc-0123456789ab",
        "gc-0123456789ab-",
        "gc-0123456789AB-s1",  # install ids are lower-case hex
        "gc-0123456789a-s1",  # 11 digits
        "gc-0123456789ab-sx",
        "gc-0123456789ab-s1-2",
        "gc-0123456789ab-c1-2",
        "gc-0123456789ab-pbeta",
        "gc-0123456789ab-pbeta-XYZ",
        "gc-0123456789ab-q1",
        "gc-0123456789ab-s" + "1" * 200,
    ],
)
def test_anything_else_is_not_one_of_our_keys(key: str) -> None:
    assert parse_key(key) is None


def test_two_state_databases_never_share_a_key() -> None:
    assert selection_key(INSTALL, 1) != selection_key("ba9876543210", 1)
    assert not selection_key("ba9876543210", 1).startswith(install_prefix(INSTALL))


@pytest.mark.parametrize(
    "call",
    [
        lambda: install_prefix("not-hex"),
        lambda: probe_key(INSTALL, "a/b", "00"),
        lambda: probe_key(INSTALL, "beta", "xyz"),
    ],
    ids=["install", "site", "token"],
)
def test_builders_refuse_what_cannot_be_a_key(call: object) -> None:
    with pytest.raises(ValueError):
        call()  # type: ignore[operator]


def test_keys_are_safe_directory_names() -> None:
    assert not is_valid_key("../etc")
    assert not is_valid_key("a b")
    assert not is_valid_key("x" * 129)
