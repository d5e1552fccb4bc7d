"""Shared by the report tests: one small sweep + report built once per test process, a PNG decoder
(no Pillow in the test dependencies) and a headless-Chromium driver over the DevTools pipe."""

from __future__ import annotations

import atexit
import functools
import json
import os
import select
import shutil
import struct
import subprocess
import tempfile
import time
import zlib
from pathlib import Path

import numba
import numpy as np

BUDGETS = (0.125, 0.25, 0.5)


@functools.cache
def built_report() -> dict:
    """A synthetic Qwen3-30B-A3B-shaped trace (300 tokens, 2 sequences, 4 domains), the default sweep
    grid at three budgets, and the report of it. Built once per process, in a temporary directory."""
    from moesim.reports.report import build_report
    from moesim.sweeps.grid import Grid
    from moesim.sweeps.run import run_sweep
    from moesim.traces.synthetic import synthesize

    root = Path(tempfile.mkdtemp(prefix="moesim-report-test-"))
    atexit.register(shutil.rmtree, root, True)
    trace = synthesize("qwen3-30b-a3b", 300, seqs=2, seed=3, path=root / "q30.parquet")
    results = root / "r.parquet"
    run_sweep([trace], Grid(budgets=list(BUDGETS)), output=results, jobs=1)
    out = root / "report"
    manifest = build_report(out, results=results)
    return {"root": root, "trace": trace, "results": results, "out": out, "manifest": manifest}


# ---------------------------------------------------------------------------------------------- PNG


@numba.njit(cache=False)
def _unfilter(data, h, stride, bpp):
    """Undo the PNG scanline filters (None, Sub, Up, Average, Paeth)."""
    out = np.zeros((h, stride), np.uint8)
    prev = np.zeros(stride, np.int32)
    pos = 0
    for y in range(h):
        ft = data[pos]
        pos += 1
        for x in range(stride):
            raw = np.int32(data[pos + x])
            a = np.int32(out[y, x - bpp]) if x >= bpp else 0
            b = prev[x]
            c = prev[x - bpp] if x >= bpp else 0
            if ft == 1:
                v = raw + a
            elif ft == 2:
                v = raw + b
            elif ft == 3:
                v = raw + (a + b) // 2
            elif ft == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                v = raw + (a if pa <= pb and pa <= pc else (b if pb <= pc else c))
            else:
                v = raw
            out[y, x] = v & 0xFF
        for x in range(stride):
            prev[x] = out[y, x]
        pos += stride
    return out


def read_png(path) -> np.ndarray:
    """Decode an 8-bit, non-interlaced RGB/RGBA/grey PNG (what resvg writes) into [h, w, channels]."""
    blob = Path(path).read_bytes()
    assert blob[:8] == b"\x89PNG\r\n\x1a\n", f"{path}: not a PNG"
    pos, idat, ihdr = 8, [], None
    while pos < len(blob):
        n, kind = struct.unpack(">I4s", blob[pos:pos + 8])
        body = blob[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat.append(body)
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    assert depth == 8 and interlace == 0, f"{path}: unsupported PNG (depth {depth}, interlace {interlace})"
    channels = {0: 1, 2: 3, 4: 2, 6: 4}[color]
    data = np.frombuffer(zlib.decompress(b"".join(idat)), np.uint8)
    assert len(data) == h * (1 + w * channels)
    return _unfilter(data, h, w * channels, channels).reshape(h, w, channels)


def ink_fraction(img: np.ndarray) -> float:
    """Share of pixels that differ from the most common colour (the background)."""
    packed = np.zeros(img.shape[:2], np.uint32)
    for ch in range(img.shape[2]):
        packed = (packed << np.uint32(8)) | img[:, :, ch].astype(np.uint32)
    _, counts = np.unique(packed.ravel(), return_counts=True)
    return 1.0 - counts.max() / packed.size


# ---------------------------------------------------------------------------------------------- Chromium

CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-default-apps", "--disable-extensions", "--mute-audio"]


def find_chromium() -> str | None:
    for name in (os.environ.get("MOESIM_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


class Chromium:
    """Headless Chromium driven over --remote-debugging-pipe (fds 3 and 4, NUL-separated JSON): the
    DevTools protocol with no websocket client and no Python dependency."""

    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="moesim-chromium-")
        to_r, self._to_w = os.pipe()
        self._from_r, from_w = os.pipe()

        def wire():
            # dup first: a pipe end may already sit on fd 3 or 4, and dup2 onto itself would keep CLOEXEC
            a, b = os.dup(to_r), os.dup(from_w)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.proc = subprocess.Popen([exe, *CHROMIUM_FLAGS, f"--user-data-dir={self.profile}",
                                      "--remote-debugging-pipe", "about:blank"],
                                     preexec_fn=wire, close_fds=False, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_r)
        os.close(from_w)
        self._buf = b""
        self._id = 0
        self.events: list[dict] = []

    def _recv(self, deadline: float) -> dict:
        while b"\0" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from Chromium")
            ready, _, _ = select.select([self._from_r], [], [], left)
            if ready:
                chunk = os.read(self._from_r, 1 << 20)
                if not chunk:
                    raise EOFError("Chromium closed the DevTools pipe")
                self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def call(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 30):
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._to_w, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            m = self._recv(deadline)
            if m.get("id") == self._id:
                if "error" in m:
                    raise RuntimeError(f"{method}: {m['error']}")
                return m.get("result", {})
            self.events.append(m)

    def pump(self, seconds: float) -> None:
        """Collect events for a while."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._recv(deadline))
        except TimeoutError:
            pass

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        for fd in (self._to_w, self._from_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self.profile, ignore_errors=True)
