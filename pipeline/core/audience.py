"""Audiences and computed traits: input files and the diff against the last sync. Pure logic.

An audience is a computed trait whose value is ``true`` for every member and ``false`` for a user
who left (seed §6.2). Both are synced the same way (``pipeline.ops.audience_sync`` does the Kafka
part): read the file into the *desired* values, read the *state* (what receivers were last sent),
and send an identify call ``{"traits": {<property>: <value>}}`` for every user whose value differs.

Input files
    Members (``audience sync --members``): one user id per line, or a CSV file whose header row
    has a ``user_id`` column (other columns are ignored). Values (``traits sync --values``): CSV
    ``user_id,value``, with or without that header row. Ids and values are stripped of surrounding
    whitespace; blank lines are skipped; a user listed twice counts once (for values: only with
    the same value). Every problem of the whole file is collected before anything is sent.

Value types (``parse_value``), decided on the stripped cell text:
    ``true`` / ``false`` (any case)      → a JSON boolean
    an integer ``-?(0|[1-9][0-9]*)``     → a JSON number, if within ±(2^53 - 1) (exact in
                                            JavaScript); larger ones stay strings
    a JSON decimal (``3.5``, ``-1e3``)   → a JSON number (a float), if finite
    the empty cell                       → no value: the same as leaving the user out
    anything else                        → a JSON string, as written (``007`` and ``1,5`` too)

State, per user: ``value`` is the JSON text receivers were last sent (an identify call Kafka
acknowledged); ``pending`` is the JSON text of a call that was being sent when the record was
written and never confirmed (a crashed sync). A pending user is uncertain: receivers may hold either
value, so the next sync sends the desired value whatever it is. A call's messageId is derived from
its state key, its value and the time of its sync (``message_id_for``): a re-sent call carries the
same messageId as the crashed one, so receivers can dedupe it, and the state records stay small.
"""

from __future__ import annotations

import csv
import enum
import math
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from itertools import chain

import orjson

from pipeline.core.calls import MAX_ID_CHARS
from pipeline.core.exceptions import PipelineError
from pipeline.core.snake import property_name as _property_name

__all__ = [
    "TraitKind",
    "TraitSpec",
    "SyncInput",
    "SyncInputError",
    "StateEntry",
    "Change",
    "ChangeKind",
    "DiffCounts",
    "parse_value",
    "read_members",
    "read_values",
    "diff",
    "message_id_for",
    "MAX_VALUE_CHARS",
    "MAX_PROBLEMS_SHOWN",
]

#: The longest trait value (as text) a computed-trait file may hold; keeps a call far below 32 KB.
MAX_VALUE_CHARS = 8192
#: How many problems of a bad input file are listed (all of them are counted).
MAX_PROBLEMS_SHOWN = 20
#: JavaScript's Number.MAX_SAFE_INTEGER: larger integers would change value in a JS receiver.
MAX_SAFE_INTEGER = 2**53 - 1

TRUE = "true"
FALSE = "false"
NULL = "null"

_INTEGER = re.compile(r"-?(?:0|[1-9][0-9]*)")
_DECIMAL = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")


_MESSAGE_IDS = uuid.uuid5(uuid.NAMESPACE_URL, "urn:pipeline:trait-sync")


def message_id_for(key: bytes, value: str, at: int) -> str:
    """The messageId of the identify call that sends ``value`` for state ``key`` in the sync
    that started at ``at`` (epoch ms): the same on every machine and every re-run.

    >>> message_id_for(b"web/vip/u1", "true", 1795273470123)
    'ac7fdbe3-6dda-5964-82d2-646714588b15'
    """
    return str(uuid.uuid5(_MESSAGE_IDS, f"{key.decode()}\x00{value}\x00{at}"))


class TraitKind(enum.StrEnum):
    """What is being synced."""

    AUDIENCE = "audience"
    """Members get ``true``; a user who left gets ``false``."""
    COMPUTED = "computed trait"
    """Users get their value; a user who is no longer in the file gets ``null`` (trait cleared)."""


@dataclass(frozen=True, slots=True)
class TraitSpec:
    """One audience or computed trait of one source.

    >>> TraitSpec.of(TraitKind.AUDIENCE, "web", "Order Completed Last 30days").key("u1")
    b'web/order_completed_last_30days/u1'
    """

    kind: TraitKind
    source_id: str
    name: str
    #: The snake_cased name: the trait key receivers get.
    property_name: str
    #: State keys are ``<source>/<property>/<user>``; neither a source id nor a property
    #: contains ``/``, so the user id is everything after the second one.
    key_prefix: bytes = field(init=False, repr=False, compare=False)
    #: ``{"<property>":`` of every ``traits_json``.
    _traits_head: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:  # worked out once: used for every user of a sync
        object.__setattr__(self, "key_prefix", f"{self.source_id}/{self.property_name}/".encode())
        object.__setattr__(
            self, "_traits_head", "{" + orjson.dumps(self.property_name).decode() + ":"
        )

    @classmethod
    def of(cls, kind: TraitKind, source_id: str, name: str) -> TraitSpec:
        return cls(kind, source_id, name, _property_name(name))

    @property
    def absent(self) -> str:
        """The JSON value sent to a user who is no longer in the file."""
        return FALSE if self.kind is TraitKind.AUDIENCE else NULL

    def key(self, user_id: str) -> bytes:
        return self.key_prefix + user_id.encode()

    def traits_json(self, value_json: str) -> str:
        """``{"<property>":<value>}`` as compact JSON text."""
        return self._traits_head + value_json + "}"


class SyncInputError(PipelineError):
    """A members or values file with problems; nothing was sent."""

    def __init__(self, path: str, problems: list[str], total: int) -> None:
        shown = "\n".join(f"  - {p}" for p in problems)
        more = f"\n  ... and {total - len(problems)} more" if total > len(problems) else ""
        super().__init__(f"{path}: {total} problem(s), nothing was sent:\n{shown}{more}")
        self.problems = problems
        self.total = total


@dataclass(slots=True)
class SyncInput:
    """The desired values of one sync: user id → JSON text, plus what reading the file found."""

    values: dict[str, str] = field(default_factory=dict)
    rows: int = 0
    blank: int = 0
    duplicates: int = 0
    empty_values: int = 0


def parse_value(text: str) -> bool | int | float | str | None:
    """The JSON value of one computed-trait cell (see the module docstring for the rule).

    >>> [parse_value(t) for t in ("12", "3.5", "TRUE", "007", "", "gold")]
    [12, 3.5, True, '007', None, 'gold']
    """
    text = text.strip()
    if not text:
        return None
    lowered = text.lower()
    if lowered == TRUE:
        return True
    if lowered == FALSE:
        return False
    if _INTEGER.fullmatch(text):
        number = int(text)
        return number if abs(number) <= MAX_SAFE_INTEGER else text
    if _DECIMAL.fullmatch(text):
        real = float(text)
        return real if math.isfinite(real) else text
    return text


class _Problems:
    def __init__(self) -> None:
        self.shown: list[str] = []
        self.total = 0

    def add(self, line: int, message: str) -> None:
        self.total += 1
        if len(self.shown) < MAX_PROBLEMS_SHOWN:
            self.shown.append(f"line {line}: {message}")

    def raise_if_any(self, path: str) -> None:
        if self.total:
            raise SyncInputError(path, self.shown, self.total)


def _decoded(lines: Iterable[bytes], problems: _Problems) -> Iterator[str]:
    """Text lines; a line that is not UTF-8 is reported and replaced by a blank one."""
    for number, raw in enumerate(lines, start=1):
        if number == 1 and raw.startswith(b"\xef\xbb\xbf"):
            raw = raw[3:]
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            problems.add(number, f"is not UTF-8 text ({exc.reason} at byte {exc.start})")
            yield "\n"


def _check_id(user_id: str, line: int, problems: _Problems) -> bool:
    if not user_id:
        problems.add(line, "user_id is empty")
        return False
    if len(user_id) > MAX_ID_CHARS:
        problems.add(
            line, f"user_id is {len(user_id):,} characters, over the limit of {MAX_ID_CHARS:,}"
        )
        return False
    return True


def _header_index(row: list[str], column: str) -> int | None:
    names = [cell.strip().lower() for cell in row]
    return names.index(column) if column in names else None


def read_members(lines: Iterable[bytes], *, path: str = "members") -> SyncInput:
    """The members of an audience: every one gets ``true``. ``SyncInputError`` lists problems.

    The first non-blank line decides the format: a CSV header with a ``user_id`` column, or else
    one id per line (the whole line, commas and quotes included, is the id).
    """
    problems = _Problems()
    result = SyncInput()
    text = _decoded(lines, problems)
    before = 0
    first: str | None = None
    for line in text:
        if line.strip():
            first = line
            break
        before += 1
    result.blank = before
    if first is not None:
        column = _header_index(next(csv.reader([first]), []), "user_id")
        if column is None:
            _plain_members(chain([first], text), before, result, problems)
        else:
            _csv_members(text, column, before + 1, result, problems)
    problems.raise_if_any(path)
    return result


def _add_member(user_id: str, line: int, result: SyncInput, problems: _Problems) -> None:
    result.rows += 1
    if not _check_id(user_id, line, problems):
        return
    if user_id in result.values:
        result.duplicates += 1
    else:
        result.values[user_id] = TRUE


def _plain_members(
    text: Iterable[str], before: int, result: SyncInput, problems: _Problems
) -> None:
    for line, raw in enumerate(text, start=before + 1):
        user_id = raw.strip()
        if user_id:
            _add_member(user_id, line, result, problems)
        else:
            result.blank += 1


def _csv_members(
    text: Iterable[str], column: int, header_line: int, result: SyncInput, problems: _Problems
) -> None:
    reader = csv.reader(text)
    try:
        for row in reader:
            line = header_line + reader.line_num
            if not any(cell.strip() for cell in row):
                result.blank += 1
            elif column >= len(row):
                problems.add(line, f"has {len(row)} column(s), no user_id (column {column + 1})")
            else:
                _add_member(row[column].strip(), line, result, problems)
    except csv.Error as exc:
        problems.add(header_line + reader.line_num, f"is not valid CSV: {exc}")


def read_values(lines: Iterable[bytes], *, path: str = "values") -> SyncInput:
    """The values of a computed trait, from CSV ``user_id,value`` (header row optional)."""
    problems = _Problems()
    result = SyncInput()
    values = result.values
    reader = csv.reader(_decoded(lines, problems))
    id_column, value_column, width = 0, 1, 2
    first = True
    try:
        for row in reader:
            line = reader.line_num
            if not any(cell.strip() for cell in row):
                result.blank += 1
                continue
            if first:
                first = False
                header_id = _header_index(row, "user_id")
                if header_id is not None:
                    header_value = _header_index(row, "value")
                    if header_value is None:
                        problems.add(
                            line, "the header row has a user_id column but no value column"
                        )
                        break
                    id_column, value_column, width = header_id, header_value, len(row)
                    continue
            if len(row) != width:
                problems.add(line, f"has {len(row)} column(s), expected {width} (user_id,value)")
                continue
            result.rows += 1
            user_id = row[id_column].strip()
            if not _check_id(user_id, line, problems):
                continue
            cell = row[value_column]
            if len(cell) > MAX_VALUE_CHARS:
                problems.add(
                    line,
                    f"value is {len(cell):,} characters, over the limit of {MAX_VALUE_CHARS:,}",
                )
                continue
            value = parse_value(cell)
            text = NULL if value is None else orjson.dumps(value).decode()
            if value is None:
                result.empty_values += 1
            earlier = values.get(user_id)
            if earlier is not None:
                if earlier != text:
                    problems.add(
                        line,
                        f"user {user_id!r} is listed again with a different value ({text} "
                        f"after {earlier})",
                    )
                else:
                    result.duplicates += 1
                continue
            values[user_id] = text
    except csv.Error as exc:
        problems.add(reader.line_num, f"is not valid CSV: {exc}")
    problems.raise_if_any(path)
    # An empty cell means "no value": the same as a user who is not in the file.
    if result.empty_values:
        for user_id in [u for u, text in values.items() if text == NULL]:
            del values[user_id]
    return result


# ---- the diff ------------------------------------------------------------------------------------


@dataclass(slots=True)
class StateEntry:
    """What the state topic says about one user (see the module docstring)."""

    value: str | None = None
    pending: str | None = None
    #: The sync time the pending call's messageId derives from.
    pending_at: int | None = None

    @property
    def uncertain(self) -> bool:
        # Even a pending value equal to ``value`` is uncertain: the mark replaced an older one
        # whose call may be out (receivers may hold that older pending value).
        return self.pending is not None


class ChangeKind(enum.StrEnum):
    ADDED = "added"
    """The user had no value (or was not a member) and gets one."""
    CHANGED = "changed"
    """The user's value differs from the one last sent (computed traits only)."""
    REMOVED = "removed"
    """The user is no longer in the file: ``false`` for an audience, ``null`` for a trait."""
    RESENT = "resent"
    """A crashed sync left the user uncertain and the desired value equals the last sent one."""


@dataclass(frozen=True, slots=True)
class Change:
    user_id: str
    #: JSON text to send.
    value: str
    #: JSON text receivers held before, as far as the state knows (None: nothing).
    previous: str | None
    kind: ChangeKind
    #: The sync time of a crashed sync's call with this same value: sending it again with the
    #: messageId derived from that time lets receivers dedupe it.
    pending_at: int | None = None


@dataclass(slots=True)
class DiffCounts:
    added: int = 0
    changed: int = 0
    removed: int = 0
    unchanged: int = 0
    #: Users a crashed sync left uncertain; each is sent its desired value (counted once more
    #: under added/changed/removed when that value is also a change).
    uncertain: int = 0
    #: Uncertain users whose desired value is the one last confirmed: sent again all the same.
    resent: int = 0

    @property
    def sends(self) -> int:
        return self.added + self.changed + self.removed + self.resent


def _have(entry: StateEntry | None, absent: str) -> str | None:
    """The confirmed value, with the absent value (``false``/``null``) meaning none."""
    if entry is None or entry.value is None or entry.value == absent:
        return None
    return entry.value


def diff(
    desired: Mapping[str, str], state: Mapping[str, StateEntry], *, absent: str
) -> tuple[list[Change], DiffCounts]:
    """The identify calls that bring receivers from ``state`` to ``desired``.

    ``desired`` maps user id → JSON text of the value; a user missing from it gets ``absent``.
    A user whose state is uncertain (a crashed sync's pending call) is always sent the value it
    should now have, with the crashed call's messageId when the value is the same.

    >>> state = {"a": StateEntry("true"), "b": StateEntry("true")}
    >>> changes, counts = diff({"b": "true", "c": "true"}, state, absent="false")
    >>> sorted((c.user_id, c.value, c.kind.value) for c in changes)
    [('a', 'false', 'removed'), ('c', 'true', 'added')]
    """
    changes: list[Change] = []
    counts = DiffCounts()
    for user_id, want in desired.items():
        entry = state.get(user_id)
        have = _have(entry, absent)
        reuse = entry.pending_at if entry is not None and entry.pending == want else None
        if entry is not None and entry.uncertain:
            counts.uncertain += 1
            if have == want:
                counts.resent += 1
                changes.append(Change(user_id, want, have, ChangeKind.RESENT, reuse))
                continue
        if have == want:
            counts.unchanged += 1
            continue
        kind = ChangeKind.ADDED if have is None else ChangeKind.CHANGED
        if kind is ChangeKind.ADDED:
            counts.added += 1
        else:
            counts.changed += 1
        changes.append(Change(user_id, want, have, kind, reuse))
    for user_id, entry in state.items():
        if user_id in desired:
            continue
        have = _have(entry, absent)
        reuse = entry.pending_at if entry.pending == absent else None
        if entry.uncertain:
            counts.uncertain += 1
            if have is None:
                counts.resent += 1
                changes.append(Change(user_id, absent, None, ChangeKind.RESENT, reuse))
                continue
        if have is None:
            continue  # not a member before, not one now: nothing to say, not even "unchanged"
        counts.removed += 1
        changes.append(Change(user_id, absent, have, ChangeKind.REMOVED, reuse))
    return changes, counts
