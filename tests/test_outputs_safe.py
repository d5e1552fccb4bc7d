"""Nothing lost: no command replaces one of its inputs or a foreign file, an OS error while writing is one
line and leaves no partial file, a killed writer's temporary is removed by the next run, and special files
(a FIFO) are refused as inputs instead of blocking the reader.

Tests run as root here, where chmod does not stop a write: read-only and permission failures come from
/proc and /sys (which refuse new files even to root) and from a mocked OSError(EROFS); a full disk is
the kernel's own EFBIG under RLIMIT_FSIZE (works for any user, no mount needed) plus a mocked ENOSPC."""

from __future__ import annotations

import errno
import os
import resource
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner
from sweep_helpers import MOESIM, small_trace

from moesim import files
from moesim.cli import cli
from moesim.errors import MoesimError


@pytest.fixture(scope="module")
def trace(tmp_path_factory) -> Path:
    return small_trace(tmp_path_factory.mktemp("safe"))


def one_line(res, pattern: str = ""):
    """exit 2, a single 'moesim: error:' line on stderr matching ``pattern``, no traceback."""
    assert res.exit_code == 2, (res.exit_code, res.output, res.exception)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moesim: error: "), res.stderr
    assert pattern in lines[0], lines[0]
    return lines[0]


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def no_partials(directory: Path) -> None:
    left = [p.name for p in directory.rglob("*") if p.name.endswith((".partial", ".old"))]
    assert not left, left


def copy_of(trace: Path, dst: Path) -> Path:
    shutil.copyfile(trace, dst)
    return dst


# ---------------------------------------------------------------------------------------------- 1. inputs


@pytest.mark.parametrize("case", ["sweep -o", "sweep layers sibling", "mrc -o", "mrc layers sibling",
                                  "simulate --per-token", "hard link", "symlink"])
def test_never_overwrite_the_trace(case, trace, tmp_path):
    t = copy_of(trace, tmp_path / "t.parquet")
    before = t.read_bytes()
    if case == "sweep -o":
        res = invoke("sweep", t, "--budget", "0.25", "-o", t)
    elif case == "sweep layers sibling":  # -o r.parquet writes its per-layer rows to r.layers.parquet
        t = t.rename(tmp_path / "r.layers.parquet")
        res = invoke("sweep", t, "--budget", "0.25", "-o", tmp_path / "r.parquet")
    elif case == "mrc -o":
        res = invoke("mrc", t, "-e", "lru", "-o", t)
    elif case == "mrc layers sibling":
        t = t.rename(tmp_path / "c.layers.parquet")
        res = invoke("mrc", t, "-e", "lru", "-o", tmp_path / "c.parquet")
    elif case == "simulate --per-token":
        res = invoke("simulate", t, "-b", "0.25", "--per-token", t)
    elif case == "hard link":
        os.link(t, tmp_path / "alias.parquet")
        res = invoke("sweep", t, "--budget", "0.25", "-o", tmp_path / "alias.parquet")
    else:
        (tmp_path / "alias.parquet").symlink_to(t)
        res = invoke("mrc", tmp_path / "alias.parquet", "-e", "lru", "-o", t)
    one_line(res, "is an input of this command")
    assert t.read_bytes() == before
    no_partials(tmp_path)


def test_import_onto_its_own_input(tmp_path):
    src = tmp_path / "tab.parquet"
    pq.write_table(pa.table({"seq": [0, 0], "pos": [0, 1], "layer": [0, 0],
                             "experts": pa.array([[0, 1], [2, 3]], pa.list_(pa.int32()))}), src)
    before = src.read_bytes()
    one_line(invoke("import", "table", src, "--experts", "8", "-o", src), "is an input of this command")
    assert src.read_bytes() == before
    from moesim.traces.importers.table import import_table

    with pytest.raises(MoesimError, match="is an input"):
        import_table(src, src, n_experts=8)
    assert src.read_bytes() == before


def test_a_foreign_parquet_file_at_sweep_o_is_refused(trace, tmp_path):
    other = copy_of(trace, tmp_path / "other.parquet")  # a trace, not an input of this sweep
    before = other.read_bytes()
    one_line(invoke("sweep", trace, "--budget", "0.25", "-o", other), "not a moesim sweep results file")
    assert other.read_bytes() == before
    assert not (tmp_path / "other.layers.parquet").exists()
    # a foreign file at the .layers sibling of a results file is refused too
    invoke("sweep", trace, "--budget", "0.25", "-e", "lru", "-o", tmp_path / "r.parquet")
    copy_of(trace, tmp_path / "r.layers.parquet")
    one_line(invoke("sweep", trace, "--budget", "0.25", "-o", tmp_path / "r.parquet"), "per-layer file")


def test_report_never_deletes_its_input(trace, tmp_path):
    rep = tmp_path / "rep"
    rep.mkdir()
    (rep / "report.json").write_text("{}")  # looks like an earlier report, so it would be replaced
    inside = copy_of(trace, rep / "t.parquet")
    one_line(invoke("report", "--trace", inside, "-o", rep), "is an input of this command")
    assert inside.exists()


def test_special_destinations_are_refused(trace, tmp_path):
    one_line(invoke("simulate", trace, "-b", "0.25", "--per-token", "/dev/null"), "refusing to replace it")
    assert Path("/dev/null").is_char_device()
    with pytest.raises(MoesimError, match="exists and is a directory"):
        files.write_text("x", tmp_path)


# ---------------------------------------------------------------------------------------------- 3. OS errors


@pytest.mark.parametrize("where", ["/proc/moesim-test/x.parquet", "/proc/x.parquet", "/sys/x.parquet",
                                   "file/x.parquet"])
def test_unwritable_destinations_are_one_line(where, trace, tmp_path):
    if where.startswith("file/"):
        (tmp_path / "file").write_text("a file where a directory is expected")
        where = str(tmp_path / where)
    one_line(invoke("synth", "--preset", "qwen3-30b-a3b", "--tokens", "8", "-o", where), "cannot write it")
    one_line(invoke("sweep", trace, "--budget", "0.25", "-e", "lru", "-o", where), "cannot write it")
    one_line(invoke("mrc", trace, "-e", "lru", "-o", where), "cannot write it")


@pytest.mark.parametrize("code, why", [(errno.EROFS, "read-only filesystem"), (errno.ENOSPC, "no space left")])
def test_mocked_os_errors_leave_nothing(code, why, trace, tmp_path, monkeypatch):
    real = os.replace

    def fail(src, dst):
        if str(dst).startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code))
        return real(src, dst)

    monkeypatch.setattr(files.os, "replace", fail)
    one_line(invoke("synth", "--preset", "qwen3-30b-a3b", "--tokens", "8", "-o", tmp_path / "s.parquet"), why)
    one_line(invoke("mrc", trace, "-e", "lru", "-o", tmp_path / "m.csv"), why)
    one_line(invoke("sweep", trace, "--budget", "0.25", "-e", "lru", "-o", tmp_path / "r.parquet"), why)
    assert [p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")] == []


def test_mocked_full_disk_inside_the_trace_writer(tmp_path, monkeypatch):
    def full(self, *a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pq.ParquetWriter, "write_table", full)
    one_line(invoke("synth", "--preset", "qwen3-30b-a3b", "--tokens", "8", "-o", tmp_path / "s.parquet"),
             "no space left on the device")
    assert list(tmp_path.iterdir()) == []


def _limited(nbytes: int):
    def set_limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))  # Python ignores SIGXFSZ: writes get EFBIG
    return set_limit


@pytest.mark.parametrize("args, limit", [
    (["synth", "--preset", "qwen3-30b-a3b", "--tokens", "400", "-o", "{d}/s.parquet"], 100_000),
    (["import", "table", "{table}", "--experts", "8", "-o", "{d}/i.parquet"], 1_000),
    (["mrc", "{trace}", "-o", "{d}/m.csv"], 50_000),
    (["sweep", "{trace}", "--budget", "0.25", "-e", "lru", "-o", "{d}/r.parquet", "--jobs", "1"], 20_000),
])
def test_full_disk_is_one_line_and_leaves_no_file(args, limit, trace, tmp_path):
    table = tmp_path / "tab.csv"
    rows = "\n".join(f"0,{p},0,{p % 8};{(p + 1) % 8}" for p in range(2000))
    table.write_text("seq,pos,layer,experts\n" + rows + "\n")
    out = tmp_path / "out"
    out.mkdir()
    argv = [a.format(d=out, trace=trace, table=table) for a in args]
    proc = subprocess.run(MOESIM + argv, capture_output=True, text=True, timeout=600, preexec_fn=_limited(limit))
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "cannot write it (file too large" in lines[0], proc.stderr
    assert [p.name for p in out.iterdir() if not p.name.endswith(".lock")] == []


# ---------------------------------------------------------------------------------------------- stale temporaries


def _dead_pid() -> int:
    pid = int(Path("/proc/sys/kernel/pid_max").read_text()) if Path("/proc/sys/kernel/pid_max").exists() else 99999
    for candidate in range(pid - 1, 1, -1):
        try:
            os.kill(candidate, 0)
        except ProcessLookupError:
            return candidate
        except PermissionError:
            continue
    pytest.skip("no free pid")


def test_stale_temporaries_of_dead_writers_are_removed(trace, tmp_path):
    dead, alive = _dead_pid(), os.getppid()
    rep = tmp_path / "rep"
    stale = [tmp_path / f".rep.{dead}.partial", tmp_path / f".rep.{dead}-3.partial", tmp_path / f".rep.{dead}.old"]
    for d in stale:
        (d / "charts").mkdir(parents=True)
    running = tmp_path / f".rep.{alive}-0.partial"  # another live process's: left alone
    running.mkdir()
    stale_file = tmp_path / f".s.parquet.{dead}-0.partial"
    stale_file.write_bytes(b"half a trace")
    files.remove_stale_partials(rep)
    files.remove_stale_partials(tmp_path / "s.parquet")
    assert not any(d.exists() for d in stale) and not stale_file.exists() and running.exists()


def test_kill_9_mid_write_then_rerun_cleans_up(tmp_path):
    """A real kill -9 while synth writes: the temporary stays (nothing can remove it); the next writer of
    the same file removes it."""
    out = tmp_path / "big.parquet"
    proc = subprocess.Popen(MOESIM + ["synth", "--preset", "qwen3-next-80b-a3b", "--tokens", "4000", "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while not list(tmp_path.glob(".big.parquet.*.partial")):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=60)
    assert list(tmp_path.glob(".big.parquet.*.partial")) and not out.exists()
    assert invoke("synth", "--preset", "qwen3-30b-a3b", "--tokens", "8", "-o", out).exit_code == 0
    assert not list(tmp_path.glob(".big.parquet.*")) and out.exists()


# ---------------------------------------------------------------------------------------------- 5. FIFOs


@pytest.mark.parametrize("args", [["info", "{fifo}"], ["validate", "{fifo}"],
                                  ["sweep", "{trace}", "--config", "{fifo}"],
                                  ["import", "table", "{fifo}", "--experts", "8", "-o", "{d}/x.parquet"],
                                  ["import", "jsonl", "{fifo}", "--experts", "8", "-o", "{d}/x.parquet"],
                                  ["models", "show", "{fifo}"]])
def test_a_fifo_is_refused_not_read(args, trace, tmp_path):
    fifo = tmp_path / ("f.toml" if "models" in args or "--config" in args else "f.parquet")
    os.mkfifo(fifo)
    argv = [a.format(fifo=fifo, trace=trace, d=tmp_path) for a in args]
    proc = subprocess.run(MOESIM + argv, capture_output=True, text=True, timeout=120)  # a hang fails here
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not a regular file" in lines[0], proc.stderr


def test_regular_file_helper(tmp_path):
    with pytest.raises(MoesimError, match="no such file"):
        files.regular_file(tmp_path / "none")
    with pytest.raises(MoesimError, match="is a directory"):
        files.regular_file(tmp_path)
    (tmp_path / "bad.toml").write_bytes(b"\xff\xfe = 1")
    with pytest.raises(MoesimError, match="not UTF-8"):
        files.read_toml(tmp_path / "bad.toml")


def test_temporary_names_are_unique(tmp_path):
    names = {files.temp_path(tmp_path / "x.parquet") for _ in range(100)}
    assert len(names) == 100 and all(p.name.startswith(f".x.parquet.{os.getpid()}-") for p in names)
    assert np.all([p.parent == tmp_path for p in names])


def test_report_removes_a_killed_reports_temporary_and_fails_cleanly(trace, tmp_path, monkeypatch):
    from moesim.reports import report

    monkeypatch.setattr(report, "_make_figures_and_tables", lambda *a: ([], []))  # no charts: fast
    dead = _dead_pid()
    stale = tmp_path / f".rep.{dead}.partial"  # what kill -9 during `moesim report` leaves
    (stale / "charts").mkdir(parents=True)
    assert invoke("report", "--trace", trace, "-o", tmp_path / "rep").exit_code == 0
    assert not stale.exists() and (tmp_path / "rep" / "index.html").exists()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(report, "_write", full)
    one_line(invoke("report", "--trace", trace, "-o", tmp_path / "rep"), "no space left on the device")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rep"]  # the old report stays, no temporary


def test_export_never_overwrites_the_trace(trace, tmp_path):
    t = copy_of(trace, tmp_path / "t.parquet")
    before = t.read_bytes()
    one_line(invoke("export", t, "-b", "0.25", "--format", "json", "-o", t), "is an input of this command")
    assert t.read_bytes() == before
