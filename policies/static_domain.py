"""One pin table per domain of the trace (``static-domain[:W]``): an engine that knows which kind of prompt it
serves (code, chat, a language) pins that domain's hot experts and switches tables when the domain changes.

Each domain's table is its most requested experts, as ``static`` chooses them (the top slots of each layer, or
of the whole pool with ``--allocation global``), over its tokens in the learning range: the whole trace, the
first W tokens with ``static-domain:W`` (a sweep's holdout: sweeps/holdout.py); a domain
without tokens there has an empty table. The table of the first token with a domain is resident from the start;
at each token whose domain differs from the current one (tokens without a domain keep it) the experts of the old
table not in the new one are evicted and the new table's others uploaded at the start of the token, copies the
token waits for (priced by the clock like fetches); misses are never admitted. Refused on a trace without domains."""

import numpy as np

from moesim.errors import MoesimError
from moesim.policies.params import Param
from moesim.policies.static import most_requested

NAME = "static-domain"
DOC = ("one pinned table per domain of the trace (its most requested experts; static-domain:W: from the first W "
       "tokens), switched when the domain changes; the switch's uploads priced")
PARAM = Param("prefix_tokens", "W", "a positive whole number of tokens", integer=True)
LEARNS = True  # from the trace's counts: a sweep learns it from a holdout prefix (sweeps/holdout.py)


def pinned(counts: np.ndarray, slots: int, allocation: str) -> np.ndarray:
    """(Unused: the schedule gives the initial table.)"""
    return np.zeros(0, np.int64)


def tables(source, values, slots: int, allocation: str) -> dict[int, set]:
    """Each domain code's table: the objects (layer x E + expert) it pins."""
    domain = np.asarray(source.domain)
    if not len(domain) or (domain < 0).all():
        raise MoesimError("static-domain needs a trace with domains (the domain column; moesim import ... "
                          "--domain, docs/trace-format.md): this trace has none")
    sel = np.asarray(source.sel)
    T, L, _ = sel.shape
    E = source.n_experts
    learn = int(values[0]) if values is not None else T
    out: dict[int, set] = {}
    for d in np.unique(domain[domain >= 0]).tolist():
        rows = np.nonzero(domain[:learn] == d)[0]
        counts = np.zeros((L, E), np.int64)
        part = sel[rows]
        for l in range(L):
            x = part[:, l, :].reshape(-1)
            counts[l] = np.bincount(x[x >= 0].astype(np.int64), minlength=E)
        out[int(d)] = set(most_requested(counts, slots, allocation).tolist()) if len(rows) else set()
    return out


def schedule(source, values, slots: int, allocation: str):
    """The initial pinned objects and the pin events [(token, object, -1 | +1)] at the domain switches."""
    table = tables(source, values, slots, allocation)
    n_obj = source.n_layers * source.n_experts
    masks = {}
    for d, objs in table.items():
        masks[d] = np.zeros(n_obj, np.bool_)
        masks[d][list(objs)] = True
    domain = np.asarray(source.domain).astype(np.int64)
    first = int(np.nonzero(domain >= 0)[0][0])
    # the domain in force at each token (tokens without one keep the last) and the tokens where it changes
    t_known = np.nonzero(domain >= 0)[0]
    switches = t_known[1:][domain[t_known[1:]] != domain[t_known[:-1]]]
    events: list[np.ndarray] = []
    cur = masks[int(domain[first])]
    for t in switches.tolist():
        new = masks[int(domain[t])]
        outs, ins = np.nonzero(cur & ~new)[0], np.nonzero(new & ~cur)[0]
        events.append(np.stack([np.full(len(outs), t), outs, np.full(len(outs), -1)], axis=1))
        events.append(np.stack([np.full(len(ins), t), ins, np.full(len(ins), 1)], axis=1))
        cur = new
    ev = np.concatenate(events).astype(np.int64) if events else np.zeros((0, 3), np.int64)
    return np.array(sorted(table[int(domain[first])]), np.int64), ev
