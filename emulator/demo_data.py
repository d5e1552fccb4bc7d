"""The demo model's text: three domains every Debian/Ubuntu Python machine has offline, held out by
file for evaluation, and the byte-level BPE trained on the training split.

- code: the Python standard library's own top-level modules (``sysconfig``'s stdlib folder);
- docs: the Python reference documentation that ships inside the stdlib (``pydoc_data.topics``);
- legal: license texts in ``/usr/share/common-licenses`` and ``/usr/share/doc/*/copyright``
  (Debian's base-files and every installed package); where that folder does not exist, the
  license files of the installed Python packages (``*.dist-info/LICENSE*``).

Files are sorted and a file is held out when zlib.crc32 of its name % 8 == 0, so the split is fixed
by the sources (docs/emulator.md says when the legal domain is not fixed across machines). A training
run keeps the split it trained on (``train_state/texts.json.gz``) and a resumed run or a variant reads
that, not the sources again: installing a Debian package changes the legal domain.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import sysconfig
import zlib
from pathlib import Path

from moesim.errors import MoesimError
from moesim.files import atomic

DOMAINS = ("code", "docs", "legal")
HELD_OUT = 8          # a file is held out for evaluation when crc32(name) % HELD_OUT == 0
EVAL_CHARS = 60_000   # characters of each domain's evaluation text
CAP_CHARS = 3_000_000  # training characters kept per domain (the largest source is capped)
KEPT = "texts.json.gz"  # the split a run trained on, in its train_state/ folder


def _held_out(name: str) -> bool:
    return zlib.crc32(name.encode()) % HELD_OUT == 0


def sources() -> dict[str, list[tuple[str, str]]]:
    """{domain: [(name, text), ...]} sorted by name."""
    out: dict[str, list[tuple[str, str]]] = {}
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out["code"] = [(p.name, p.read_text(encoding="utf-8", errors="replace")) for p in sorted(stdlib.glob("*.py"))]
    import pydoc_data.topics as topics

    out["docs"] = [(k, v) for k, v in sorted(topics.topics.items())]
    legal = []
    lic = Path("/usr/share/common-licenses")
    if lic.is_dir():
        legal += [(f"common-licenses/{p.name}", p.read_text(errors="replace")) for p in sorted(lic.iterdir())
                  if p.is_file()]
        legal += [(f"doc/{p.parent.name}", p.read_text(errors="replace"))
                  for p in sorted(Path("/usr/share/doc").glob("*/copyright")) if p.is_file()]
    else:
        import site

        for sp in sorted(site.getsitepackages()):
            legal += [(f"{p.parent.name}/{p.name}", p.read_text(errors="replace"))
                      for p in sorted(Path(sp).glob("*.dist-info/LICENSE*")) if p.is_file()]
    out["legal"] = legal
    for d in DOMAINS:
        if not out[d]:
            raise SystemExit(f"demo_model: found no text for the {d} domain")
    return out


def split(src: dict) -> tuple[dict[str, str], dict[str, str], dict]:
    train, evals, info = {}, {}, {}
    for d, files in src.items():
        tr = [t for n, t in files if not _held_out(n)]
        ev = [t for n, t in files if _held_out(n)]
        train[d] = "\n\n".join(tr)[:CAP_CHARS]
        evals[d] = "\n\n".join(ev)[:EVAL_CHARS]
        info[d] = {"files": len(files), "train_files": len(tr), "eval_files": len(ev),
                   "train_chars": len(train[d]), "eval_chars": len(evals[d]),
                   "train_sha256": hashlib.sha256(train[d].encode()).hexdigest()[:16],
                   "eval_sha256": hashlib.sha256(evals[d].encode()).hexdigest()[:16],
                   "names": [n for n, _ in files][:5] + (["..."] if len(files) > 5 else [])}
    return train, evals, info


def save_split(texts: tuple[dict, dict, dict], path: Path) -> None:
    train, evals, info = texts
    with atomic(path) as tmp, gzip.open(tmp, "wt", encoding="utf-8") as f:
        json.dump({"train": train, "eval": evals, "info": info}, f)


def load_split(path: Path) -> tuple[dict[str, str], dict[str, str], dict]:
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            doc = json.load(f)
        return doc["train"], doc["eval"], doc["info"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise MoesimError(f"{path}: not a readable demo-model text split ({type(e).__name__})") from None


def kept_split(*state_dirs: Path | None) -> tuple[dict[str, str], dict[str, str], dict] | None:
    """The split kept in the first of ``state_dirs`` that holds one (a run's own, then its baseline's)."""
    for d in state_dirs:
        if d is not None and (d / KEPT).exists():
            return load_split(d / KEPT)
    return None


def make_tokenizer(texts: list[str], vocab: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    # chunks: the trainer counts words per item; one huge string would be one item
    tok.train_from_iterator((t[i:i + 10_000] for t in texts for i in range(0, len(t), 10_000)), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
