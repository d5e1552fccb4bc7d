"""Trace a local transformers checkpoint over text files (teacher-forced forward passes)."""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import re
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import check_output
from moesim.traces.tracers import families
from moesim.traces.tracers.texts import TokenSequence, source_meta, split_sequences

INSTALL_HINT = "PyTorch and transformers are not installed: pip install 'moesim[torch]'"


def import_transformers():
    # No hub access: a missing local file must fail, not start a download.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import torch
        import transformers
    except ImportError:
        raise MoesimError(INSTALL_HINT) from None
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()   # moesim shows its own, on a terminal only
    return torch, transformers


def check_model_dir(model_dir: str | os.PathLike) -> dict:
    """The config.json of a local checkpoint directory (else one clear error)."""
    p = Path(model_dir)
    cfg = p / "config.json"
    if not p.is_dir() or not cfg.is_file():
        raise MoesimError(f"{model_dir}: not a local transformers model directory (no config.json); "
                          "download the checkpoint first, moesim never reaches the hub")
    try:
        config = json.loads(cfg.read_text())
    except (ValueError, RecursionError) as exc:
        raise MoesimError(f"{cfg}: not valid JSON ({exc})") from None
    families.family_of(config.get("model_type", "?"))
    return config


def load_local(model_dir: str | os.PathLike, dtype: str = "auto", device: str | None = None):
    """(model, tokenizer) from a local directory, never the hub; on ``device`` (default:
    the first CUDA GPU when there is one, else the CPU)."""
    check_model_dir(model_dir)
    torch, transformers = import_transformers()
    kw = {"local_files_only": True}
    with _load_report(transformers) as report:
        try:
            transformers.AutoConfig.from_pretrained(str(model_dir), **kw)
        except Exception as exc:  # noqa: BLE001 - see above
            raise MoesimError(f"{model_dir}/config.json: transformers refuses it ({_first_line(exc)})") from None
        try:
            tok = transformers.AutoTokenizer.from_pretrained(str(model_dir), **kw)
        except Exception as exc:  # noqa: BLE001 - see above
            raise MoesimError(f"{model_dir}: cannot load its tokenizer ({_first_line(exc)})") from None
        if not tok("a b", add_special_tokens=False)["input_ids"]:
            raise MoesimError(f"{model_dir}: its tokenizer turns text into no tokens (no tokenizer.json or "
                              "tokenizer.model saved with the checkpoint?)")
        torch_dtype = "auto" if dtype == "auto" else getattr(torch, dtype)
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch_dtype, **kw)
        except Exception as exc:  # noqa: BLE001 - see above
            raise MoesimError(f"{model_dir}: cannot load the model ({_why(exc, report.getvalue())})") from None
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        model.to(device)
    except (RuntimeError, AssertionError) as exc:
        raise MoesimError(f"cannot move the model to {device} ({_first_line(exc)})") from None
    model.eval()
    return model, tok


# What a damaged or inconsistent checkpoint raises while loading is anyone's guess: a config value of the
# wrong type (a strict-dataclass TypeError), weights of other shapes than config.json says (RuntimeError), a
# truncated safetensors file (safetensors' own Exception subclass)... All are the checkpoint's fault.
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@contextlib.contextmanager
def _load_report(transformers):
    """transformers' log while loading (its weight-loading report names a mismatch), kept off the terminal."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log = transformers.utils.logging
    level = log.get_verbosity()
    log.disable_default_handler()
    log.add_handler(handler)
    log.set_verbosity_warning()  # the loading report is a warning
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield buf
    finally:
        log.set_verbosity(level)
        log.remove_handler(handler)
        log.enable_default_handler()


def _why(exc: Exception, report: str) -> str:
    """The report line that names a mismatched or missing tensor, else the exception's first line."""
    for line in _ANSI.sub("", report).splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) >= 3 and cells[1] in ("MISMATCH", "MISSING"):
            return f"its weights do not match config.json: {cells[0]} {cells[1].lower()}, {cells[2]}"[:300]
    return _first_line(exc)


def _first_line(exc: Exception) -> str:
    """The exception's first line (and the next, when the first only introduces it)."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    if not lines:
        return type(exc).__name__
    return " ".join(lines[:2]) if lines[0].endswith(":") else lines[0]


def tokenizer_bos(tok) -> int | None:
    """The BOS id when the tokenizer starts every input with it (Mixtral-style), else None."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is None:
        return None
    probe = tok("a", add_special_tokens=True)["input_ids"]
    return bos if probe and probe[0] == bos else None


def hf_sequences(tok, texts: Sequence[str], domains: Sequence[str] | None, seq_len: int,
                 max_tokens: int | None) -> list[TokenSequence]:
    def tokenize(text: str) -> list[int]:
        return list(tok(text, add_special_tokens=False)["input_ids"])
    return split_sequences(texts, domains, tokenize, seq_len, max_tokens, bos=tokenizer_bos(tok))


def hf_model_id(model_dir: str | os.PathLike, config: dict, model_id: str | None = None) -> str:
    """The model id a trace of this checkpoint carries (so emulator results join its sweeps)."""
    mid = model_id or config.get("_name_or_path") or Path(model_dir).resolve().name
    if os.path.isabs(mid) or os.sep in mid and Path(mid).exists():
        mid = Path(mid).name
    return mid


def trace_hf(model_dir: str | os.PathLike, texts: Sequence[str], out: str | os.PathLike, *,
             domains: Sequence[str] | None = None, seq_len: int = 512, max_tokens: int | None = None,
             candidates: int | None = None, dense: bool = False, dtype: str = "auto", device: str | None = None,
             model_id: str | None = None, lookahead: bool = False,
             progress: Callable[[int, int], None] | None = None, model=None, tokenizer=None) -> Path:
    """Teacher-forced forward passes of a local checkpoint over ``texts`` in sequences of
    ``seq_len`` tokens; writes the trace ``out``. ``model``/``tokenizer`` skip loading
    (both already built from ``model_dir``). ``progress(done, total)`` is called after
    each sequence with the tokens done so far and the total to do. ``lookahead``: also record the
    lookahead column (the next MoE layer's router on each layer's input)."""
    config = check_model_dir(model_dir)
    check_output(out, [model_dir, *texts])
    from moesim.traces.tracers.torch_hooks import NO_LOOKAHEAD, record_router

    fam = str(config.get("model_type"))
    if lookahead and fam in NO_LOOKAHEAD:
        raise MoesimError(f"--lookahead is not supported for {fam}: {NO_LOOKAHEAD[fam]}")
    torch, _ = import_transformers()

    if model is None or tokenizer is None:
        model, tokenizer = load_local(model_dir, dtype, device)
    seqs = hf_sequences(tokenizer, texts, domains, seq_len, max_tokens)
    labels = [s.domain for s in seqs]
    doms = sorted({d for d in labels if d is not None}) or None
    src = source_meta(texts, domains, seq_len, max_tokens, seqs)
    src["model_dir"] = str(Path(model_dir).resolve())
    src["dtype"] = str(next(model.parameters()).dtype).replace("torch.", "")
    mid = hf_model_id(model_dir, config, model_id)
    with torch.inference_mode(), record_router(model, out, model_id=mid, layout="dense" if dense else "sparse",
                                               candidates=candidates, domains=doms, source=src,
                                               lookahead=lookahead) as rec:
        done = 0
        for s in seqs:
            rec.domain = s.domain
            ids = torch.tensor([s.tokens], dtype=torch.long, device=model.device)
            model(input_ids=ids, use_cache=False)
            done += len(s.tokens)
            if progress is not None:
                progress(done, src["tokens"])
    return Path(out)
