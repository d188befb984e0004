"""Rows as codes of their distinct projections on a few fields: what score keeps of a million rows."""

from array import array
from itertools import chain
from operator import itemgetter, methodcaller

_ABSENT = object()
_PLAIN = {str, type(None), type(_ABSENT)}  # value types equal only to their own kind: no need to key on them


class Projections:
    """Rows → their `fields` (those they have, all of them with fields None), as codes of distinct projections:
    a million rows hold a handful of dicts, not a million. Values are told apart by type too (1, 1.0 and true
    are equal keys); a row with a list or object among them is a projection of its own."""

    def __init__(self, fields: tuple[str, ...] | None):
        self.fields = fields
        self.table: list[dict] = []  # code → projection
        self._code_of: dict[tuple, int] = {}
        self._getters = [methodcaller("get", field, _ABSENT) for field in fields or ()]
        self._every_field = itemgetter(*fields) if fields else None

    def codes(self, rows: list[dict]) -> tuple[array, list[dict]]:
        """The rows' codes, and the projections first seen among them (the next codes, in order)."""
        known = len(self.table)
        if self.fields is None:
            self.table += rows
            return array("I", range(known, len(self.table))), rows
        keys = self._plain_keys(rows)
        if keys is None:
            columns = [list(map(get, rows)) for get in self._getters]
            for column in columns[:]:
                if not set(map(type, column)) <= _PLAIN:
                    columns.append(list(map(type, column)))
            keys = list(zip(*columns)) if columns else [()] * len(rows)
        try:
            codes = list(map(self._code_of.get, keys))
        except TypeError:  # a list or an object among the values: each row is looked at
            codes = [None] * len(keys)
        if None in codes:
            for i, code in enumerate(codes):
                if code is None:
                    codes[i] = self._code(keys[i])
        return array("I", codes), self.table[known:]

    def _plain_keys(self, rows: list[dict]) -> list[tuple] | None:
        """The rows' keys at once where every row has every field and no value needs its type beside it (the
        common case); else None."""
        if self._every_field is None:
            return None
        try:
            values = list(map(self._every_field, rows))
        except KeyError:
            return None
        keys = values if len(self._getters) > 1 else list(zip(values))
        return keys if set(map(type, chain.from_iterable(keys))) <= _PLAIN else None

    def shared(self, rows: list[dict]) -> list[dict]:
        """The rows' projections."""
        return list(map(self.table.__getitem__, self.codes(rows)[0]))

    def _code(self, key: tuple) -> int:
        try:
            code = self._code_of.get(key)
        except TypeError:
            hashable = False
        else:
            hashable = True
            if code is not None:
                return code
        code = len(self.table)
        assert self.fields is not None
        self.table.append({field: value for field, value in zip(self.fields, key) if value is not _ABSENT})
        if hashable:
            self._code_of[key] = code
        return code
