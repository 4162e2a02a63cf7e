"""Student names as a person reads them: look-alikes are flagged, never merged.

Rows are keyed by the raw folder name and shown escaped (a backslash doubled first, so ``zed\\x07`` is not
``zed`` + BEL). Names are compared by their confusable skeleton (Unicode TR39, ICU's spoof checker), after case
folding and stripping; a name holding a default-ignorable character is refused.
"""

from __future__ import annotations

from .grade_report import one_line


class NamesUnavailable(RuntimeError):
    """ICU's binding is missing: a class's names cannot be compared (the grader stops: exit status 2)."""


def _icu():
    try:
        import icu
    except ImportError:
        raise NamesUnavailable("comparing student names needs ICU's Python binding: pip install "
                           "'modern-block[classroom]' (or pyicu-wheels)") from None
    return icu


def shown(name: str) -> str:
    """``name`` on one line, escaped so that no two names show the same."""
    return one_line(name.replace("\\", "\\\\"))


def invisible(name: str) -> str | None:
    """Why a name cannot be trusted for what it hides, or None: default-ignorable characters, or space around it."""
    icu = _icu()
    hidden = [ch for ch in name if icu.Char.hasBinaryProperty(ch, icu.UProperty.DEFAULT_IGNORABLE_CODE_POINT)]
    if hidden:
        codes = ", ".join(f"U+{ord(ch):04X}" for ch in dict.fromkeys(hidden))
        return f"invisible (default-ignorable) characters ({codes})"
    if name != name.strip():
        return "space before or after it"
    return None


def keys(name: str, checker=None) -> set[str]:
    """What ``name`` looks like: its TR39 skeleton, and that of its case-folded form, case-folded."""
    checker = checker or _icu().SpoofChecker()
    text = name.strip()
    return {checker.getSkeleton(0, text).casefold(), checker.getSkeleton(0, text.casefold()).casefold()}


def look_alikes(names) -> dict[str, list[str]]:
    """For each name that looks like another of ``names``: the others it looks like."""
    checker = _icu().SpoofChecker()
    by_key: dict[str, set[str]] = {}
    for name in set(names):
        for key in keys(name, checker):
            by_key.setdefault(key, set()).add(name)
    found: dict[str, set[str]] = {}
    for group in by_key.values():
        for name in group if len(group) > 1 else ():
            found.setdefault(name, set()).update(group - {name})
    return {name: sorted(others) for name, others in found.items()}
