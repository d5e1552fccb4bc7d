"""Tracebacks and unclear messages of issue 33: binary and Latin-1 CSVs, nan cells, uint64 ids, duplicate
prompt names, FIFOs and full disks named as such, Python warnings held back behind the one error line."""

from __future__ import annotations

import errno
import os
import warnings

import numpy as np
import pytest
from click.testing import CliRunner
from test_hostile_input import one_line

from moesim.cli import cli
from moesim.errors import MoesimError


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.parametrize("data, pattern", [
    (bytes(range(256)) * 4, "not UTF-8 text \\(byte 128\\); a CSV file must be UTF-8"),
    (b"seq,pos,layer,experts,domain\n0,0,0,1;2,caf\xe9\n", "not UTF-8 text \\(byte 42\\)"),
    (b"seq,pos,layer,experts,weights\n0,0,0,1;2,nan;0.5\n", "column weights holds NaN or infinite values"),
    (b"seq,pos,layer,experts\n18446744073709551615,0,0,1;2\n", "column seq value .* is out of range"),
])
def test_table_csv_cells(data, pattern, tmp_path):
    src = tmp_path / "t.csv"
    src.write_bytes(data)
    one_line(invoke("import", "table", src, "--experts", "8", "-o", tmp_path / "o.parquet"), pattern)


def test_uint64_expert_ids_are_shown_as_they_are(tmp_path):
    np.save(tmp_path / "u.npy", np.array([[[2**64 - 1, 1]]], dtype=np.uint64))
    one_line(invoke("import", "array", tmp_path / "u.npy", "--experts", "8", "-o", tmp_path / "o.parquet"),
             "expert id 18446744073709551615 is out of range")


def test_duplicate_prompt_names(tmp_path):
    src = tmp_path / "p.json"
    src.write_text('{"num_experts": 8, "top_k": 2, "prompts": {"a": {"prefill": [[[1, 2]]]}, '
                   '"a": {"prefill": [[[1, 3]]]}}}')
    one_line(invoke("import", "prompts", src, "-o", tmp_path / "o.parquet"), "a JSON object names 'a' twice")


@pytest.mark.parametrize("cmd", [["hw", "show"], ["models", "show"],
                                 ["estimate", "--model", "qwen3-30b-a3b", "--hw", "rtx3090-pcie4", "--engine"]])
def test_an_existing_fifo_is_not_reported_missing(cmd, tmp_path):
    fifo = tmp_path / "f.toml"
    os.mkfifo(fifo)
    one_line(invoke(*cmd, fifo), "not a regular file \\(a FIFO, device or socket\\)")


def test_probe_on_a_full_disk_names_the_directory(tmp_path, monkeypatch):
    from moesim.costmodel import probe

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(probe, "open", full, raising=False)
    with pytest.raises(MoesimError, match=f"{tmp_path}: cannot write the 1 MiB probe file there \\(no space left"):
        probe.nvme_reads(str(tmp_path), 1)


def test_warnings_are_held_back_behind_the_error_line(monkeypatch):
    from moesim.costmodel import hardware

    real = hardware.load_hardware

    def noisy(name):
        warnings.warn("a library's advice\nover two lines", UserWarning, stacklevel=2)
        if name == "bad":
            raise MoesimError("bad machine")
        return real(name)

    monkeypatch.setattr(hardware, "load_hardware", noisy)
    one_line(invoke("hw", "show", "bad"), "bad machine")
    res = invoke("hw", "show", "rtx3090-pcie4")
    assert res.exit_code == 0
    assert "moesim: warning: UserWarning: a library's advice over two lines" in res.stderr.splitlines()
