"""The policy registries are the single source: every registered eviction and miss policy is in the help
of every command that takes one, in the generated semantics tables (which must be current), in
`moesim policies`, and has a reference implementation beside the tests."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from reference_policies import make_policy

from moesim.cli import cli
from moesim.errors import MoesimError
from moesim.policies import doc, miss, registry
from moesim.policies import hooks as hooks_mod

REPO = Path(__file__).resolve().parents[1]


def _help(*cmd) -> str:
    r = CliRunner().invoke(cli, [*cmd, "--help"], terminal_width=10_000)
    assert r.exit_code == 0, r.output
    return " ".join(r.output.split())


def test_semantics_tables_are_generated_and_current():
    assert doc.main(["--check"]) == 0, "docs/replay-semantics.md is stale: run python -m moesim.policies.doc"


@pytest.mark.parametrize("command", [("simulate",), ("sweep",), ("mrc",)])
def test_every_eviction_is_in_the_help(command):
    text = _help(*command)
    missing = [e.spec for e in registry.EVICTIONS if e.spec not in text]
    assert not missing, f"moesim {' '.join(command)} --help misses {missing}"


@pytest.mark.parametrize("command", [("simulate",), ("sweep",)])
def test_every_miss_policy_is_in_the_help(command):
    text = _help(*command)
    assert all(p.name in text for p in miss.MISS_POLICIES.values())


def test_every_policy_has_a_semantics_row_and_a_policies_line():
    text = (REPO / "docs" / "replay-semantics.md").read_text()
    listed = CliRunner().invoke(cli, ["policies"]).output
    for e in registry.EVICTIONS:
        assert re.search(rf"^\| `{re.escape(e.name)}` \|", text, re.M), f"no row for {e.name}"
        assert e.spec in listed and e.doc, e.name
    for p in miss.MISS_POLICIES.values():
        assert re.search(rf"^\| `{re.escape(p.name)}(:θ|:Q)?` \|", text, re.M), f"no row for {p.name}"


def test_every_eviction_has_a_reference_implementation():
    for e in registry.EVICTIONS:
        if e.pinned:  # pinned sets: tests/reference_replay.py computes them by name
            assert e.name in ("static", "static-layers", "repin", "static-domain"), \
                f"{e.name}: add its pinned set to reference_replay"
            continue
        make_policy(e.name, 4, score={}, next_use=lambda o, now: (0,))


def test_codes_hooks_and_parsing_derive_from_the_records():
    assert [e.code for e in registry.EVICTIONS] == list(range(len(registry.EVICTIONS)))
    for e in registry.EVICTIONS:
        hooks = e.hooks()
        assert hooks.hit is (hooks_mod.no_hit if e.pinned else e.module.hit)  # pinned placements share no-ops
        assert e.hook_set == ("pinned" if e.pinned else e.name)
        assert registry.parse_eviction(e.name) == (e.name, None)
        if e.param is None:
            with pytest.raises(MoesimError, match="takes no parameter"):
                registry.parse_eviction(f"{e.name}:3")
    with pytest.raises(MoesimError, match=", ".join(registry.names())):
        registry.parse_eviction("nope")
    assert set(registry.default_evictions()) <= set(registry.names())
    assert all(spec.split(":")[0] in miss.MISS_POLICIES for spec in miss.default_misses())
