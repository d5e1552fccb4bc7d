"""Input texts -> token sequences of fixed length, shared by both tracers so that the
same text files give the same sequences (given the same tokenizer)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from moesim import files
from moesim.errors import MoesimError


@dataclass(frozen=True)
class TokenSequence:
    tokens: list[int]
    domain: str | None
    text: str          # the file the tokens came from


def domain_labels(texts: Sequence[str], domains: Sequence[str] | None) -> list[str | None]:
    """One label per text file: none, one for every file, or one per file."""
    if not domains:
        return [None] * len(texts)
    if len(domains) == 1:
        return [domains[0]] * len(texts)
    if len(domains) != len(texts):
        raise MoesimError(f"give one --domain per --text file ({len(texts)} texts, {len(domains)} domains), "
                          "or a single --domain for all")
    return list(domains)


def read_text(path: str) -> str:
    return files.read_text(path, "text file")


def split_sequences(texts: Sequence[str], domains: Sequence[str] | None, tokenize: Callable[[str], list[int]],
                    seq_len: int, max_tokens: int | None = None, bos: int | None = None) -> list[TokenSequence]:
    """Tokenize each text file, keep at most ``max_tokens`` of it, cut it into sequences of
    ``seq_len`` tokens (the last one may be shorter). ``bos``, when the model's tokenizer
    starts every input with it, is prepended to each sequence and counts towards its length."""
    if not texts:
        raise MoesimError("give at least one --text file")
    if seq_len < 2:
        raise MoesimError(f"--seq-len must be at least 2, got {seq_len}")
    if max_tokens is not None and max_tokens < 1:
        raise MoesimError(f"--max-tokens must be positive, got {max_tokens}")
    labels = domain_labels(texts, domains)
    body = seq_len - (bos is not None)
    out: list[TokenSequence] = []
    for path, label in zip(texts, labels):
        ids = list(tokenize(read_text(path)))
        if not ids:
            raise MoesimError(f"{path}: the text is empty (no tokens)")
        budget = len(ids) + len(ids) // max(body, 1) + 1 if max_tokens is None else max_tokens
        for start in range(0, len(ids), body):
            chunk = ([bos] if bos is not None else []) + ids[start:start + body]
            chunk = chunk[:budget]
            if len(chunk) < 1 or (bos is not None and len(chunk) < 2):
                break
            out.append(TokenSequence(chunk, label, str(path)))
            budget -= len(chunk)
    return out


def source_meta(texts: Sequence[str], domains: Sequence[str] | None, seq_len: int, max_tokens: int | None,
                seqs: list[TokenSequence]) -> dict:
    return {
        "texts": [str(t) for t in texts],
        "domains": domain_labels(texts, domains),
        "seq_len": seq_len,
        "max_tokens_per_text": max_tokens,
        "sequences": len(seqs),
        "tokens": sum(len(s.tokens) for s in seqs),
        "teacher_forced": True,
    }
