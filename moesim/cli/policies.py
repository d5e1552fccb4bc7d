"""`moesim policies`: the eviction, miss and prefetch policies the replay knows, from their registries."""

from __future__ import annotations

import click

from moesim.cli.output import FORMAT_OPTION, echo_json


@click.command("policies")
@FORMAT_OPTION
def command(fmt):
    """List every eviction policy (with its parameter, and whether the default
    sweep includes it), every miss policy, every admission rule and every
    prefetch policy, one line each. The full rules are in
    docs/replay-semantics.md."""
    from moesim.policies import admission, miss, prefetch, registry

    evictions = [{"name": e.name, "spec": e.spec, "doc": e.doc, "default_sweep": e.in_default_grid,
                  "parameter": e.param.what if e.param else None, "fixed": dict(e.fixed)} for e in registry.EVICTIONS]
    misses = [{"name": p.name, "spec": miss.spec_of(p), "doc": p.doc,
               "default_sweep": list(p.grid)} for p in miss.MISS_POLICIES.values()]
    prefetches = [{"name": p.name, "spec": p.name, "doc": p.doc} for p in prefetch.PREFETCH_POLICIES.values()]
    admissions = [{"name": spec.partition("[")[0], "spec": spec, "doc": doc} for spec, doc in admission.RULES]
    if fmt == "json":
        echo_json({"evictions": evictions, "misses": misses, "admissions": admissions, "prefetches": prefetches})
        return
    click.echo("eviction (-e)")
    width = max(len(e["spec"]) for e in evictions + misses)
    for e in evictions:
        click.echo(f"  {e['spec']:<{width}}  {e['doc']}{'' if e['default_sweep'] else '  [not in the default sweep]'}")
    click.echo("miss (-m)")
    for p in misses:
        click.echo(f"  {p['spec']:<{width}}  {p['doc']}{'' if p['default_sweep'] else '  [not in the default sweep]'}")
    click.echo("admission (--admission)")
    for p in admissions:
        click.echo(f"  {p['spec']:<{width}}  {p['doc']}")
    click.echo("prefetch (--prefetch, for the layer --prefetch-depth D ahead)")
    for p in prefetches:
        click.echo(f"  {p['spec']:<{width}}  {p['doc']}")
