"""Static placements an engine can run: which experts (or whole layers) stay on the GPU, written as
llama.cpp flags, a per-layer pin list, fitz-tec's pin list, moe-l2's router map, ktransformers' GPU-expert
mask or JSON, with the hit rate and time per token the replay expects of that placement.

Stock llama.cpp places experts per layer: a layer's experts are one stacked tensor per projection
(``blk.N.ffn_{gate,up,down}_exps``, or a fused ``ffn_gate_up_exps``), and ``--n-cpu-moe N`` keeps the
tensors of blocks 0..N-1 in host memory, exactly as ``-ot`` with llama.cpp's own per-block pattern
(``llm_ffn_exps_block_regex`` in its common/common.h) does. A per-expert placement (``static``) is
for engines with an expert cache that read pin lists.

Re-pinning placements change their pinned set along the trace: ``repin:N[,G]`` is written as its schedule (JSON, or
``schedule``: CSV of token, layer, expert, in|out), which no engine we know of reads from a file (a driver of your
own replays it); ``static-domain`` as its schedule too, and, with ``domain``, as one domain's table in every pin-list
format (an engine serving that domain's prompts loads it: a static pin list)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any

from moesim.errors import MoesimError
from moesim.files import write_bytes, write_text
from moesim.jsonable import plain
from moesim.policies import registry
from moesim.simulator import SimConfig
from moesim.sweeps.inputs import load_traces
from moesim.sweeps.single import simulate_one
from moesim.textsafe import term

POLICIES = ("static", "static-layers", "repin", "static-domain")
FORMATS = ("llama.cpp", "pins", "json", "fitz-tec", "moe-l2", "ktransformers", "schedule")
SCHEDULE_FORMATS = ("json", "schedule")  # what a re-pinning schedule is written as
BINARY_FORMATS = ("ktransformers",)
# llama.cpp common/common.h: LLM_FFN_EXPS_REGEX, and llm_ffn_exps_block_regex(i) = "blk\\.<i>" + it
LLAMA_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def block_pattern(blocks: list[int]) -> str:
    """One -ot tensor-name pattern matching the expert tensors of these transformer blocks."""
    alt = "|".join(str(b) for b in sorted(blocks))
    return rf"blk\.({alt}){LLAMA_EXPS_REGEX}" if len(blocks) > 1 else rf"blk\.{alt}{LLAMA_EXPS_REGEX}"


def on_cpu(tensor_name: str, pattern: str) -> bool:
    """Does llama.cpp's override (std::regex_search, ECMAScript) send this tensor to the CPU?"""
    return re.search(pattern, tensor_name) is not None


@dataclass
class Placement:
    trace: str
    model_id: str
    synthetic: bool
    policy: str
    slots_per_layer: int
    budget: float | None
    layers: list[int]                   # original indices of the MoE layers
    gpu_experts: dict[int, list[int]]   # original layer index -> experts kept on the GPU
    cpu_blocks: list[int] = field(default_factory=list)  # whole-layer placements: blocks whose experts stay on CPU
    expected: dict[str, Any] = field(default_factory=dict)
    ranked: dict[int, list[int]] = field(default_factory=dict)  # layer -> its GPU experts, most requested first
    n_experts: int = 0
    top_k: int = 0
    n_model_layers: int = 0  # the model's layers, dense ones included (the layer index space of the engines)
    # re-pinning placements: the swaps [(token, original layer index, expert, +1 in | -1 out)], outs first at a token
    schedule: list[tuple[int, int, int, int]] | None = None
    tables: dict[str, dict[int, list[int]]] = field(default_factory=dict)  # static-domain: domain -> its table
    domain: str | None = None  # static-domain: the domain whose table gpu_experts is (None: the first token's)
    start_experts: dict[int, list[int]] = field(default_factory=dict)  # re-pinning: pinned before the first token

    @property
    def n_cpu_moe(self) -> int | None:
        """llama.cpp --n-cpu-moe N: blocks 0..N-1 keep their experts in host memory. Only a placement
        whose CPU layers are a prefix of the blocks can say it this way."""
        if not self.cpu_blocks:
            return 0
        n = max(self.cpu_blocks) + 1
        gpu = set(self.layers) - set(self.cpu_blocks)
        return n if all(b >= n for b in gpu) else None

    def llama_cpp(self) -> str:
        if self.policy != "static-layers":
            raise MoesimError("stock llama.cpp places whole layers (a layer's experts are one tensor): export "
                              "--policy static-layers for llama.cpp flags, or --format pins|json for a per-expert "
                              "placement")
        # every comment line stays one comment line: a newline in a trace name or model id must not start an
        # uncommented line (a flag of its own) in a file people paste into a command line
        lines = [f"# moesim export: {self.policy} placement of {term(self.trace)} ({term(self.model_id)}"
                 f"{', SYNTHETIC trace' if self.synthetic else ''}), {self.slots_per_layer} slots per layer",
                 f"# GPU keeps the experts of {len(self.layers) - len(self.cpu_blocks)} of {len(self.layers)} MoE "
                 f"layers; {_expected_line(self.expected)}",
                 "# pass ONE of the two lines below to llama-cli / llama-server (with -ngl 99):"]
        if self.n_cpu_moe is not None:
            lines.append(f"--n-cpu-moe {self.n_cpu_moe}")
        if self.cpu_blocks:
            lines.append(f'-ot "{block_pattern(self.cpu_blocks)}=CPU"')
        else:
            lines.append("# (every MoE layer fits on the GPU: no override needed)")
        return "\n".join(lines) + "\n"

    def schedule_csv(self) -> str:
        """The swaps as CSV: ``token,layer,expert,action`` (in | out), in replay order (outs first at a token);
        the experts pinned before the first token are rows of token -1 (action in)."""
        if self.schedule is None:
            raise MoesimError(f"{self.policy} pins one set for the whole trace: there is no schedule (use "
                              "--format pins|json)")
        rows = ["token,layer,expert,action"] + [f"-1,{layer},{e},in" for layer in self.layers
                                                for e in self.start_experts.get(layer, [])]
        rows += [f"{t},{layer},{e},{'in' if a > 0 else 'out'}" for t, layer, e, a in self.schedule]
        return "\n".join(rows) + "\n"

    def _static_only(self, fmt: str) -> None:
        """A pin-list format holds one set: a re-pinning schedule cannot be one (a domain's table can)."""
        if self.schedule is not None and (self.policy.startswith("repin") or self.domain is None):
            extra = " or --domain NAME for one domain's table" if self.policy.startswith("static-domain") else ""
            raise MoesimError(f"{self.policy} changes its pinned set along the trace: --format {fmt} holds one set "
                              f"of experts; write the schedule (--format json|schedule){extra}")

    def pins_csv(self) -> str:
        rows = ["layer,expert"] + [f"{layer},{e}" for layer in self.layers for e in self.gpu_experts[layer]]
        return "\n".join(rows) + "\n"

    def document(self) -> dict:
        doc = {"trace": self.trace, "model_id": self.model_id, "synthetic": self.synthetic, "policy": self.policy,
               "budget": self.budget, "slots_per_layer": self.slots_per_layer,
               "gpu_experts": {str(k): v for k, v in self.gpu_experts.items()}, "expected": self.expected}
        if self.schedule is not None:
            doc["schedule"] = [{"token": t, "layer": layer, "expert": e, "action": "in" if a > 0 else "out"}
                               for t, layer, e, a in self.schedule]
            doc["gpu_experts_at_start"] = {str(k): v for k, v in self.start_experts.items()}
        if self.tables:
            doc["domain"] = self.domain
            doc["tables"] = {d: {str(k): v for k, v in t.items()} for d, t in self.tables.items()}
        if self.policy == "static-layers":
            doc["llama.cpp"] = {"n_cpu_moe": self.n_cpu_moe, "cpu_blocks": self.cpu_blocks,
                                "override_tensor": f"{block_pattern(self.cpu_blocks)}=CPU" if self.cpu_blocks else None}
        return plain(doc)

    def fitz_tec(self) -> str:
        """fitz-tec's EXPERT_CACHE_PIN_LIST v1 (the layout fitz_tec/tools/build_pin_list.py 0.1.1 writes and its
        patched llama.cpp reads): ``n_layer``, ``n_expert``, then ``layer <il>: ids`` for every model layer,
        most requested first; layers without pins have an empty list."""
        lines = ["# EXPERT_CACHE_PIN_LIST v1", f"# source trace: {self.trace}", f"# top_k: {self.top_k}",
                 "# format: 'layer <il>: <eid_most_freq> <eid_next> ...' (descending by activation count)",
                 f"# moesim export: {self.policy} placement ({self.model_id}"
                 f"{', SYNTHETIC trace' if self.synthetic else ''}), {self.slots_per_layer} slots per layer; "
                 f"{_expected_line(self.expected)}",
                 "# run the engine with -P equal to -c (every slot pinned) for the placement this expects",
                 f"n_layer {self.n_model_layers}", f"n_expert {self.n_experts}"]
        for il in range(self.n_model_layers):
            lines.append(f"layer {il}: " + " ".join(str(e) for e in self.ranked.get(il, [])))
        return "\n".join(lines) + "\n"

    def moe_l2(self) -> str:
        """moe-l2's router map (moe_l2/router_table.py 0.14.1, MOE_L2_ROUTER_FILE): ``# EXPERT_TOTAL n`` (the
        engine sizes its cache from it), then ``<layer> ids`` per layer with pins, ids ascending."""
        rows = [(layer, sorted(self.gpu_experts[layer])) for layer in self.layers if self.gpu_experts[layer]]
        total = sum(len(ids) for _, ids in rows)
        return "".join([f"# EXPERT_TOTAL {total}\n"] + [f"{layer} " + " ".join(map(str, ids)) + "\n"
                                                          for layer, ids in rows])

    def ktransformers_mask(self):
        """ktransformers' GPU-expert mask: bool [num_layers, num_experts], True = the expert is on the GPU, rows
        indexed by the model's layer (KTMoEWrapper's layer_idx; kt-kernel's generate_gpu_experts_masks shape)."""
        import numpy as np

        mask = np.zeros((self.n_model_layers, self.n_experts), dtype=bool)
        for layer, ids in self.gpu_experts.items():
            mask[layer, ids] = True
        return mask

    def render(self, fmt: str) -> str:
        if fmt not in SCHEDULE_FORMATS:
            self._static_only(fmt)
        if fmt == "schedule":
            return self.schedule_csv()
        if fmt == "llama.cpp":
            return self.llama_cpp()
        if fmt == "pins":
            return self.pins_csv()
        if fmt == "fitz-tec":
            return self.fitz_tec()
        if fmt == "moe-l2":
            return self.moe_l2()
        if fmt == "ktransformers":
            return f"ktransformers GPU-expert mask {list(self.ktransformers_mask().shape)} (.npy, bool)\n"
        return json.dumps(self.document(), indent=2) + "\n"

    def render_bytes(self, fmt: str) -> bytes:
        if fmt == "ktransformers":
            self._static_only(fmt)
            import io

            import numpy as np

            buf = io.BytesIO()
            np.save(buf, self.ktransformers_mask(), allow_pickle=False)
            return buf.getvalue()
        return self.render(fmt).encode()


def with_interval(e: dict, name: str, scale: float, spec: str) -> str:
    """Expected value ``name`` x ``scale``, with ±half its interval when there is one."""
    text = format(scale * e[name], spec)
    iv = e.get("intervals", {}).get(name)
    return f"{text}±{format(scale * (iv[1] - iv[0]) / 2, spec)}" if iv else text


def _expected_line(e: dict) -> str:
    if not e:
        return "no replay"
    s = f"expected hit rate {with_interval(e, 'hit_rate', 100, '.1f')}% (replay, misses computed on the CPU)"
    if e.get("ms_per_token") is not None:
        s += f", {with_interval(e, 'ms_per_token', 1, '.2f')} ms/token priced as {e['priced_as']}"
    if e.get("intervals"):
        s += f" (±: half the {e['ci_level']:g}% interval over {e['ci_units']}, docs/uncertainty.md)"
    return s


def placement(trace, *, budget: float | None = None, slots: int | None = None, policy: str = "static-layers",
              allocation: str = "per-layer", hw: str | None = None, model: str | None = None,
              quant: str | None = None, engine: str | None = None, ci=None, domain: str | None = None) -> Placement:
    """The placement a static policy keeps on the GPU for ``trace`` (a path or a Routing) and what the
    replay expects of it (misses computed on the CPU, as a static llama.cpp placement runs them); with
    ``ci`` (a simulator.bootstrap.CI), the intervals of the hit rate and the time (docs/uncertainty.md).
    A re-pinning policy (repin, static-domain) also gets its schedule; ``domain`` (static-domain) names the domain
    whose table the pin-list formats write."""
    name = registry.parse_eviction(policy)[0]
    if name not in POLICIES:
        raise MoesimError(f"export needs a static placement policy ({' or '.join(POLICIES)}), got {policy!r}")
    config = SimConfig(eviction=policy, miss="cpu", budget=budget, slots=slots, allocation=allocation)
    entry = load_traces([trace])[0]
    routing = entry.routing
    E = routing.n_experts
    slots_n = config.slots_per_layer(E)
    param = config.eviction_param
    counts = routing.request_counts() if param is None else routing.request_counts(int(param))
    layers = [int(x) for x in routing.meta.moe_layers]
    ev = registry.get(name)
    if domain is not None and name != "static-domain":
        raise MoesimError(f"--domain picks a table of static-domain, not of {policy}")
    schedule = None
    tables: dict[str, dict[int, list[int]]] = {}
    start: dict[int, list[int]] = {}
    if ev.schedules:
        pinned, events = ev.module.schedule(routing, config.eviction_values, slots_n, allocation)
        start = _per_layer(pinned, layers, E)
        schedule = [(int(t), layers[int(o) // E], int(o) % E, int(a)) for t, o, a in events]
        if name == "static-domain":
            tables = {routing.domain_names[d]: _per_layer(objs, layers, E)
                      for d, objs in ev.module.tables(routing, config.eviction_values, slots_n, allocation).items()}
            if domain is not None:
                if domain not in tables:
                    raise MoesimError(f"no domain {domain!r} in {entry.name} (its domains: {', '.join(tables)})")
                pinned = [layers.index(layer) * E + e for layer, ids in tables[domain].items() for e in ids]
    else:
        pinned = ev.module.pinned(counts, slots_n, allocation)
    gpu = _per_layer(pinned, layers, E)
    ranked = {layer: sorted(gpu[layer], key=lambda e: (-int(counts[layers.index(layer), e]), e)) for layer in layers}
    cpu_blocks = [layer for layer in layers if not gpu[layer]] if name == "static-layers" else []
    if engine is None and name == "static-layers":
        engine = "llama.cpp"
    one = simulate_one(routing, config, hw=hw, model=model, quant=quant, engine=engine, ci=ci)
    row = one.row.row(0, named=True)
    expected = {"hit_rate": row["hit_rate"], "ms_per_token": row["ms_per_token"], "tok_per_s": row["tok_per_s"],
                "priced_as": one.priced_as, "replayed_as": config.label()}
    if ci is not None:
        from moesim.simulator.units import describe

        expected.update(ci_level=ci.level, ci_units=describe(row["ci_unit"], row["ci_units"], row["ci_block_steps"]),
                        intervals={k: [row[f"{k}_low"], row[f"{k}_high"]] for k in ("hit_rate", "ms_per_token",
                                                                                    "tok_per_s")
                                   if row.get(f"{k}_low") is not None})
    return Placement(trace=entry.name, model_id=routing.meta.model_id, synthetic=routing.synthetic, policy=policy,
                     slots_per_layer=slots_n, budget=budget, layers=layers, gpu_experts=gpu, cpu_blocks=cpu_blocks,
                     expected=expected, ranked=ranked, n_experts=E, top_k=routing.top_k,
                     n_model_layers=_model_layers(routing.meta), schedule=schedule, tables=tables, domain=domain,
                     start_experts=start)


def _per_layer(objs, layers: list[int], E: int) -> dict[int, list[int]]:
    """Object ids (layer ordinal x E + expert) as {original layer index: experts ascending}."""
    out: dict[int, list[int]] = {layer: [] for layer in layers}
    for o in sorted(int(x) for x in objs):
        out[layers[o // E]].append(o % E)
    return out


def _model_layers(meta) -> int:
    """The model's number of layers: its preset's, else one past the last MoE or dense layer the trace names."""
    from moesim.costmodel.models import find_model

    preset = find_model(meta.model_id) if meta.model_id and meta.model_id != "unknown" else None
    last = max([*meta.moe_layers, *meta.dense_layers]) + 1
    return max(last, preset.n_layers) if preset is not None else last


def write_placement(p: Placement, fmt: str, out: str | os.PathLike, inputs=()) -> None:
    """``inputs``: the files the placement was made from, which ``out`` must not replace."""
    if fmt not in FORMATS:
        raise MoesimError(f"unknown export format {fmt!r} (use {', '.join(FORMATS)})")
    if fmt in BINARY_FORMATS:
        write_bytes(p.render_bytes(fmt), out, inputs=inputs)
    else:
        write_text(p.render(fmt), out, inputs=inputs)
