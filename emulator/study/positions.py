"""Where things are in a TOML text: the line of every key, table header and array element, for errors that
name file, line and field (tomllib keeps no positions)."""

from __future__ import annotations

import bisect
import re
import tomllib

Key = tuple[str | int, ...]  # a place in the document: table keys and array indices


class _Unfollowed(Exception):
    """The scan met something it does not follow; what it found so far stays."""


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")
_SCALAR = re.compile(r"[^,\]}\n#]+")  # numbers, booleans, dates (which may hold a space)


class Positions:
    """The line of every key, table header and array element of a TOML text that tomllib accepted.

    One pass over the text: headers set the current table (an array of tables counts its elements), keys are
    followed into arrays and inline tables. A place without a line of its own answers with its table's.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.i = 0
        self.newlines = [m.start() for m in re.finditer("\n", text)]
        self.found: dict[Key, int] = {}
        self.arrays: dict[Key, int] = {}  # array of tables -> elements seen so far
        try:
            self._document()
        except (_Unfollowed, RecursionError):
            pass

    def line(self, key: Key) -> int | None:
        """Line of `key`, else of the nearest enclosing table or element; None when nothing encloses it."""
        for end in range(len(key), 0, -1):
            if key[:end] in self.found:
                return self.found[key[:end]]
        return None

    def _note(self, key: Key, at: int) -> None:
        line = bisect.bisect_left(self.newlines, at) + 1
        for end in range(1, len(key) + 1):
            self.found.setdefault(key[:end], line)

    def _peek(self, ahead: int = 0) -> str:
        j = self.i + ahead
        return self.text[j] if j < len(self.text) else ""

    def _skip(self) -> None:
        """Past whitespace, newlines and comments."""
        while True:
            c = self._peek()
            if c in (" ", "\t", "\r", "\n"):
                self.i += 1
            elif c == "#":
                end = self.text.find("\n", self.i)
                self.i = len(self.text) if end < 0 else end
            else:
                return

    def _expect(self, token: str) -> None:
        self._skip()
        if not self.text.startswith(token, self.i):
            raise _Unfollowed
        self.i += len(token)

    def _document(self) -> None:
        table: Key = ()
        while True:
            self._skip()
            start = self.i
            if not self._peek():
                return
            if self._peek() != "[":
                self._pair(table)
                continue
            array = self._peek(1) == "["
            self.i += 2 if array else 1
            keys = self._key()
            self._expect("]]" if array else "]")
            if array:
                head = self._resolve(keys[:-1]) + keys[-1:]
                self.arrays[head] = self.arrays.get(head, 0) + 1
                table = head + (self.arrays[head] - 1,)
            else:
                table = self._resolve(keys)
            self._note(table, start)

    def _resolve(self, keys: tuple[str, ...]) -> Key:
        """A header's keys as a place: a name of an array of tables means its latest element."""
        key: Key = ()
        for name in keys:
            key += (name,)
            if key in self.arrays:
                key += (self.arrays[key] - 1,)
        return key

    def _key(self) -> tuple[str, ...]:
        """A dotted key; quoted parts are decoded by tomllib itself, so they match the parsed document."""
        parts = []
        while True:
            self._skip()
            if self._peek() in ('"', "'"):
                start = self.i
                self._string()
                parts.append(tomllib.loads(f"k = {self.text[start:self.i]}")["k"])
            else:
                bare = _BARE_KEY.match(self.text, self.i)
                if bare is None:
                    raise _Unfollowed
                parts.append(bare.group())
                self.i = bare.end()
            self._skip()
            if self._peek() != ".":
                return tuple(parts)
            self.i += 1

    def _pair(self, table: Key) -> None:
        start = self.i
        key = table + self._key()
        self._expect("=")
        self._note(key, start)
        self._value(key)

    def _value(self, key: Key) -> None:
        self._skip()
        opening = self._peek()
        if opening in ("[", "{"):
            closing = "]" if opening == "[" else "}"
            self.i += 1
            index = 0
            while True:
                self._skip()
                if self._peek() == closing:
                    self.i += 1
                    return
                if opening == "[":
                    self._note(key + (index,), self.i)
                    self._value(key + (index,))
                    index += 1
                else:
                    self._pair(key)
                self._skip()
                if self._peek() == ",":
                    self.i += 1
                elif self._peek() != closing:
                    raise _Unfollowed
        elif opening in ('"', "'"):
            self._string()
        else:
            scalar = _SCALAR.match(self.text, self.i)
            if scalar is None:
                raise _Unfollowed
            self.i = scalar.end()

    def _string(self) -> None:
        """Past a string of any of TOML's four kinds."""
        quote = self._peek()
        delimiter = quote * 3 if self.text.startswith(quote * 3, self.i) else quote
        self.i += len(delimiter)
        while True:
            c = self._peek()
            if not c:
                raise _Unfollowed
            if c == "\\" and quote == '"':
                self.i += 2
            elif self.text.startswith(delimiter, self.i):
                self.i += len(delimiter)
                if len(delimiter) == 3:  # a multi-line string may end in up to two quotes of its own
                    for _ in range(2):
                        if self._peek() == quote:
                            self.i += 1
                return
            else:
                self.i += 1


def field_name(key: Key) -> str:
    """`variants[2].topology.nodes`; a key that is not a bare TOML key is quoted (and escaped: one line)."""
    out = ""
    for part in key:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            name = part if _BARE_KEY.fullmatch(part) else repr(part)
            out += f".{name}" if out else name
    return out
