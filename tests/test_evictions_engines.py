"""The evictions engines run (lfuda, lcp, lfru) and the parameters of the new evictions: each rule's defining
property on a hand-made stream, mlx-flash's LCP priority evaluated as mlx-flash writes it, and bad parameters
refused with one line."""

import math

import numpy as np
import pytest
from click.testing import CliRunner
from policy_streams import reference_run, streams
from reference_policies import LCP
from replay_helpers import seeded_rng

from moesim.cli import cli


def mlx_flash_lcp_victims(capacity, stream, base=0.25, decay=128):
    """mlx-flash 0.9.2's LCPCache rule written as it is (lcp_cache.py: _priority = frequency *
    lcp_base ** (steps_since / lcp_decay), the first minimum in insertion order), each request a token."""
    cache: dict = {}  # id -> [frequency, last_step], insertion ordered
    victims = []
    for step, o in enumerate(stream.tolist()):
        if o in cache:
            cache[o][0] += 1
            cache[o][1] = step
            victims.append(-1)
            continue
        v = -1
        if len(cache) >= capacity:
            v = min(cache, key=lambda x: cache[x][0] * (base ** ((step - cache[x][1]) / decay)))
            del cache[v]
        cache[o] = [1, step]
        victims.append(v)
    return np.array(victims)


def test_lcp_key_orders_as_mlx_flash_priority():
    with seeded_rng("lcp-vs-mlx-flash") as rng:
        for kind, stream in streams(rng, 32, 4000).items():
            for c in (2, 5, 8, 16):
                for base, decay in ((0.25, 128), (0.5, 16)):
                    want = mlx_flash_lcp_victims(c, stream, base, decay)
                    _, got, _ = reference_run("lcp", c, stream, {"base": base, "decay_tokens": decay})
                    assert (got == want).all(), (kind, c, base, decay)


def test_lcp_prefers_recent_over_frequent_after_enough_tokens():
    """Frequency 8 used 400 tokens ago (8 x 0.25^(400/128) = 0.105) loses to frequency 1 used now."""
    p = LCP(2)
    for i in range(8):
        (p.hit if "a" in p else p.insert)("a", i)
    p.insert("b", 400)
    assert p.insert("c", 400) == "a"
    assert math.isclose(8 * 0.25 ** (400 / 128), 0.105, abs_tol=1e-3)


def test_lfuda_ages_out_a_formerly_popular_expert():
    stream = np.array([0] * 100 + [1, 2, 3, 4, 5] * 60)  # a churning set beside a long-past favourite
    _, victims, policy = reference_run("lfuda", 3, stream)
    assert 0 in victims.tolist()  # LFU would keep expert 0 (10 requests) forever
    _, lfu_victims, _ = reference_run("lfu", 3, stream)
    assert 0 not in lfu_victims.tolist()
    assert policy.age > 0


def test_lfru_decay_forgets_old_heat():
    """Without decay the expert requested 20 times long ago stays; halving every 4 tokens forgets it."""
    stream = np.array([0] * 20 + [1, 2, 3] * 6)
    _, keep, _ = reference_run("lfru", 3, stream)
    _, forget, _ = reference_run("lfru", 3, stream, {"decay_tokens": 4})
    assert 0 not in keep.tolist() and 0 in forget.tolist()


@pytest.mark.parametrize("spec", ["lruk:0", "lruk:4", "lruk:1.5", "lruk:nan", "lfru:0", "lfru:-2", "lfru:inf",
                                  "lfru:2.5", "lfuda:3", "lcp:1", "twoq:2", "lirs:1"])
def test_bad_eviction_parameters_are_one_line(shipped_trace, spec):
    out = CliRunner().invoke(cli, ["simulate", str(shipped_trace), "-e", spec, "--slots", "8"])
    assert out.exit_code == 2, out.output
    lines = [x for x in out.output.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), out.output
