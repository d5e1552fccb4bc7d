"""Every command and option is documented: docs/cli.md is generated from the commands and must be
current, and the README's command table names every command."""

from pathlib import Path

from moesim.cli.reference import all_commands, render

REPO = Path(__file__).resolve().parents[1]


def test_cli_reference_is_current():
    current = (REPO / "docs" / "cli.md").read_text()
    assert current == render(), "docs/cli.md is stale: run python -m moesim.cli.reference > docs/cli.md"


def test_readme_names_every_command():
    readme = (REPO / "README.md").read_text()
    missing = [name for name, _ in all_commands() if name != "moesim" and f"`{name}" not in readme]
    assert not missing, f"README.md does not mention: {', '.join(missing)}"


def test_every_command_has_help():
    for name, cmd in all_commands():
        assert (cmd.help or cmd.short_help), f"{name} has no help text"
        for p in cmd.params:
            if p.param_type_name == "option" and not p.hidden:
                assert getattr(p, "help", None), f"{name} {p.opts[0]} has no help text"
