"""Snake-casing of audience and computed-trait names into profile property names (seed §6.2).

    >>> snake_case("Order Completed Last 30days")
    'order_completed_last_30days'

The rule, in order:

1. The name is put in Unicode NFC form; apostrophes (``'`` and ``’``) are dropped, so
   ``"Customer's Orders"`` becomes ``customers_orders``.
2. Every character that is not a letter or a digit (spaces, punctuation, ``_``, ``-``, symbols)
   separates words. Runs of separators count as one; leading and trailing ones vanish.
3. Inside a run of letters and digits a new word starts at a camelCase step: a capital after a
   lowercase letter or a digit (``orderCompleted`` → ``order``, ``completed``; ``last30Days`` →
   ``last30``, ``days``), and the last capital of an acronym that a lowercase letter follows
   (``HTTPServer`` → ``http``, ``server``).
4. Digits never start a word by themselves: ``30days`` and ``top10`` stay one word each.
5. Words are lowercased and joined with ``_``. Letters outside ASCII are kept (``Café`` → ``café``).

A name with no letter or digit snake-cases to the empty string, which ``property_name`` rejects.
"""

from __future__ import annotations

import unicodedata

__all__ = ["snake_case", "property_name", "MAX_PROPERTY_CHARS"]

#: The longest property name we produce (a profile trait key).
MAX_PROPERTY_CHARS = 255
_APOSTROPHES = str.maketrans("", "", "'\u2019")


def _is_upper(char: str) -> bool:
    return char.isupper()


def _is_lower_or_digit(char: str) -> bool:
    # Letters without case (CJK, ...) behave like lowercase ones: they never split a word.
    return char.isalnum() and not char.isupper()


def _split_run(run: str) -> list[str]:
    """Split one run of letters and digits at its camelCase steps."""
    words: list[str] = []
    start = 0
    for i in range(1, len(run)):
        prev, cur = run[i - 1], run[i]
        if not _is_upper(cur):
            continue
        acronym_end = _is_upper(prev) and i + 1 < len(run) and run[i + 1].islower()
        if _is_lower_or_digit(prev) or acronym_end:
            words.append(run[start:i])
            start = i
    words.append(run[start:])
    return words


def snake_case(name: str) -> str:
    """The snake_case form of ``name`` (see the module docstring for the rule); may be empty."""
    text = unicodedata.normalize("NFC", name).translate(_APOSTROPHES)
    words: list[str] = []
    run: list[str] = []
    for char in text + " ":
        if char.isalnum():
            run.append(char)
        elif run:
            words += _split_run("".join(run))
            run = []
    return "_".join(word.lower() for word in words)


def property_name(name: str, *, field: str = "--name") -> str:
    """The property for an audience or trait name; ``ValueError`` naming ``field`` if unusable."""
    prop = snake_case(name)
    if not prop:
        raise ValueError(
            f"{field}: {name!r} has no letter or digit, so its snake_case property name is empty"
        )
    if len(prop) > MAX_PROPERTY_CHARS:
        raise ValueError(
            f"{field}: the property name is {len(prop)} characters, "
            f"over the limit of {MAX_PROPERTY_CHARS}"
        )
    return prop
