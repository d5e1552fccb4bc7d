"""Write the plain TOML of a machine file (tables of scalars with a [table.sources] sub-table)."""

from __future__ import annotations


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)) or hasattr(v, "item"):
        v = v.item() if hasattr(v, "item") else v
        return repr(round(v, 6) if isinstance(v, float) else v)
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"') + '"'


def dumps(doc: dict) -> str:
    lines = [f"{k} = {_value(v)}" for k, v in doc.items() if not isinstance(v, dict)]
    for name, table in doc.items():
        if not isinstance(table, dict):
            continue
        lines += ["", f"[{name}]"] + [f"{k} = {_value(v)}" for k, v in table.items() if not isinstance(v, dict)]
        if table.get("sources"):
            lines += [f"[{name}.sources]"] + [f"{k} = {_value(v)}" for k, v in table["sources"].items()]
    return "\n".join(lines) + "\n"
