"""Issue 3 "Must show": `moesim simulate --format json` miss counts equal libCacheSim's on real
routing held back from this repository (the FLAME-MoE sample in ../shared), per layer and with a
global pool, for lru/lfu/fifo/belady/arc/s3fifo/sieve/clock under fetch-all."""

import json

import numpy as np
import pytest
from click.testing import CliRunner
from replay_helpers import libcachesim_misses, oracle_trace

from moesim.cli import cli
from moesim.policies import registry
from moesim.traces import load_routing
from moesim.traces.importers.flame import import_flame

pytest.importorskip("libcachesim", reason="libcachesim (test extra) is not installed")


@pytest.fixture(scope="module")
def flame_trace(tmp_path_factory, flame_dir):
    out = tmp_path_factory.mktemp("flame") / "prefill.parquet"
    import_flame(flame_dir, out, layout="prefill")
    return out


@pytest.mark.parametrize("policy", list(registry.libcachesim_twins()))
def test_simulate_json_equals_libcachesim_on_real_flame(flame_trace, tmp_path, policy):
    routing = load_routing(flame_trace)
    L, E = routing.n_layers, routing.n_experts
    for slots in (4, 16, 32):
        out = CliRunner().invoke(cli, ["simulate", str(flame_trace), "-e", policy, "-m", "fetch-all",
                                       "--slots", str(slots), "--format", "json"])
        assert out.exit_code == 0, out.output
        doc = json.loads(out.output)
        for l in range(L):
            stream = routing.sel[:, l, :].reshape(-1).astype(np.int64)
            oracle_trace(tmp_path / "s.oracle", stream)
            want = libcachesim_misses(tmp_path / "s.oracle", policy, slots, len(stream))
            assert doc["layers"][l]["misses"] == want, f"{policy} slots={slots} layer {doc['layers'][l]['layer']}"
        out = CliRunner().invoke(cli, ["simulate", str(flame_trace), "-e", policy, "-m", "fetch-all",
                                       "--slots", str(slots), "--allocation", "global", "--format", "json"])
        doc = json.loads(out.output)
        stream = (routing.sel.astype(np.int64) + (np.arange(L) * E)[None, :, None]).reshape(-1)
        oracle_trace(tmp_path / "g.oracle", stream)
        want = libcachesim_misses(tmp_path / "g.oracle", policy, slots * L, len(stream))
        assert doc["totals"]["misses"] == want, f"{policy} global slots={slots}"
