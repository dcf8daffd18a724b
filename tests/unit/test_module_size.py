"""No module of ``pipeline/`` is over 600 lines: past that a module holds more than one idea, and
a newcomer reads it as a maze (``roles/deliver.py`` reached 1,040). Split by idea, not by size."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "pipeline"
MAX_LINES = 600


def oversized(root: Path = PACKAGE) -> list[str]:
    """``module: N lines`` for each module over ``MAX_LINES``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        lines = len(path.read_text(encoding="utf-8").splitlines())
        if lines > MAX_LINES:
            found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_module_is_over_600_lines() -> None:
    assert oversized() == []


def test_the_rule_sees_a_module_over_the_limit(tmp_path: Path) -> None:
    (tmp_path / "pipeline").mkdir()
    (tmp_path / "pipeline" / "small.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "pipeline" / "big.py").write_text("x = 1\n" * (MAX_LINES + 1))
    assert oversized(tmp_path / "pipeline") == [f"pipeline/big.py: {MAX_LINES + 1} lines"]
