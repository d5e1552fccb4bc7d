"""numba's cache per component (moesim/jitcache.py) and the compile notice: what a kernel's cache depends on,
that docstrings and comments do not count, that nothing is cached under the source tree, and that a long compile
is announced on stderr (only then, and never on stdout)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from moesim import jitcache
from moesim.policies import registry

REPO = Path(__file__).resolve().parents[1]
TRACE = REPO / "traces" / "qwen3next.parquet"


def _component(*modules: str) -> set[str]:
    return set(jitcache.component_modules(modules))


def test_a_kernel_depends_on_its_policy_and_the_replay_code_only():
    plain_lru = _component("moesim.simulator.kernel_plain", *registry.get("lru").hook_modules)
    assert {"moesim.simulator.kernel_plain", "moesim.policies.lru", "moesim.policies.lists",
            "moesim.policies.structures", "moesim.simulator.host_ram", "moesim.simulator.reset"} <= plain_lru
    others = {"moesim.policies.lfu", "moesim.policies.arc", "moesim.policies.registry", "moesim.traces.synthetic",
              "moesim.traces.synth_kernel", "moesim.traces.writer", "moesim.sweeps.run", "moesim.reports.report",
              "moesim.costmodel.timing", "moesim.simulator.kernel_ext"}
    assert not plain_lru & others, plain_lru & others
    generic = _component("moesim.simulator.kernel_ext", *registry.generic_modules())
    assert {"moesim.policies.lfu", "moesim.policies.freq", "moesim.policies.belady"} <= generic
    assert not generic & {"moesim.policies.arc", "moesim.policies.sieve", "moesim.traces.synthetic",
                          "moesim.policies.registry"}


def test_docstrings_comments_and_doc_lines_do_not_count(tmp_path):
    a, b, c = tmp_path / "a.py", tmp_path / "b.py", tmp_path / "c.py"
    a.write_text('"""A module."""\nDOC = "one"\n\n\ndef f(x):\n    """Doc."""\n    return x + 1  # why\n')
    b.write_text('"""Another text."""\nDOC = ("two "\n       "lines")\n\n\ndef f(x):\n    return x + 1\n')
    c.write_text('"""A module."""\nDOC = "one"\n\n\ndef f(x):\n    return x + 2\n')
    digest = {p.name: jitcache._parse(p)[0] for p in (a, b, c)}
    assert digest["a.py"] == digest["b.py"] != digest["c.py"]


def _run(code: str, cache: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, XDG_CACHE_HOME=str(cache))
    env.pop("NUMBA_CACHE_DIR", None)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)


def test_a_long_compile_is_announced_on_stderr_once(tmp_path):
    args = ["moesim", "simulate", str(TRACE), "-e", "lru", "-m", "fetch-all", "--budget", "0.25", "--format", "json"]
    code = f"import sys; from moesim.cli import main; sys.argv = {args!r}; main()"
    cold, warm = _run(code, tmp_path), _run(code, tmp_path)
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    lines = cold.stderr.strip().splitlines()
    assert lines[0].startswith("moesim: compiling the replay kernel once for this install (cached in "), lines
    assert lines[-1].startswith("moesim: compiled in ") and lines[-1].endswith(" s"), lines
    assert warm.stderr == "", warm.stderr  # cached: nothing said
    for out in (cold.stdout, warm.stdout):
        json.loads(out)  # stdout stays the command's JSON
    before = {p for p in REPO.rglob("*") if p.suffix in (".nbi", ".nbc")}
    assert not before, f"numba cache files under the source tree: {sorted(before)[:3]}"


def test_nothing_is_cached_under_the_source_tree_without_a_cache_directory(tmp_path):
    blocked = tmp_path / "not-a-dir"
    blocked.write_text("a file where the cache directory would go")
    code = ("from moesim.simulator import kernels; kernels.ensure([kernels.variant('fifo', 'plain')]); "
            "from moesim.traces import derived")
    res = _run(code, blocked)
    assert res.returncode == 0, res.stderr
    assert not [p for p in REPO.rglob("*") if p.suffix in (".nbi", ".nbc")]
