"""Shared-prefix scheduling: a group's first task (its leader) goes alone, its siblings once it is answered, so that
a prefix-caching server computes their prefix once (docs/design.md#shared-prefix-scheduling)."""

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

GroupOf = Callable[[Any], str | None]  # a task's prefix group; None: no group, it goes at once


@dataclass
class _Group:
    key: str
    leader: Any  # the task whose answer warms the group's prefix
    since: float  # when the leader was handed out (monotonic)
    waiting: deque = field(default_factory=deque)  # siblings held until the leader is answered
    released: bool = False  # the leader outlived its patience: siblings go at once


class PrefixSchedule:
    """Hands out `tasks` to concurrent workers, each group's leader first and alone."""

    def __init__(self, tasks: Iterable, group_of: GroupOf, stop: asyncio.Event, *, patience_s=60.0, lookahead=4096):
        self._source, self._group_of, self._stop = iter(tasks), group_of, stop
        self.patience_s, self.lookahead = patience_s, max(1, lookahead)
        self._exhausted = False
        self._groups: dict[str, _Group] = {}  # groups whose leader is out (or promoted and about to go)
        self._promoted: deque = deque()  # siblings of a failed leader, now their group's leader
        self._released: deque = deque()  # siblings of an answered leader
        self._waiting = 0  # siblings held in the groups
        self._changed = asyncio.Event()

    async def next(self) -> Any | None:
        """The next task to work on, waiting for a leader when only its siblings remain; None: no more (or stop)."""
        while not self._stop.is_set():
            if (task := self._take()) is not None:
                return task
            if self._exhausted and not self._waiting:  # nothing is left that a leader could release
                return None
            await self._wait_for_change()
        return None

    def watching(self, work: Callable[[Any, Any], Awaitable[Any]]) -> Callable[[Any, Any], Awaitable[Any]]:
        """`work` that tells the schedule how each task ended: answered (it returned) or failed (it raised)."""

        async def watched(task: Any, client: Any) -> Any:
            try:
                result = await work(task, client)
            except BaseException:
                self.ended(task, answered=False)
                raise
            self.ended(task, answered=True)
            return result

        return watched

    def ended(self, task: Any, answered: bool) -> None:
        """If the task led a group: answered, its siblings go; failed (it stays pending), its next sibling leads."""
        key = self._group_of(task)
        group = None if key is None else self._groups.get(key)
        if group is None or group.leader is not task:
            return
        if not answered and group.waiting and not group.released:
            group.leader = group.waiting.popleft()
            group.since = time.monotonic()
            self._waiting -= 1
            self._promoted.append(group.leader)
        else:
            del self._groups[group.key]
            self._release(group)
        self._changed.set()
        self._changed = asyncio.Event()

    def _take(self) -> Any | None:
        """A task that may go now, reading ahead in the source as far as `lookahead` allows; None: none."""
        if self._promoted:
            return self._promoted.popleft()
        if self._released:
            return self._released.popleft()
        while not self._exhausted and self._waiting < self.lookahead:
            try:
                task = next(self._source)
            except StopIteration:
                self._exhausted = True
                break
            key = self._group_of(task)
            if key is None:
                return task
            group = self._groups.get(key)
            if group is None:
                self._groups[key] = _Group(key, task, time.monotonic())
                return task
            if group.released:
                return task
            group.waiting.append(task)
            self._waiting += 1
        return None

    def _release(self, group: _Group) -> None:
        self._waiting -= len(group.waiting)
        self._released.extend(group.waiting)
        group.waiting.clear()

    async def _wait_for_change(self) -> None:
        """Until a leader ends, the run stops, or the oldest leader outlives its patience."""
        pending = [g.since for g in self._groups.values() if not g.released]
        timeout = max(0.0, min(pending) + self.patience_s - time.monotonic()) if pending else None
        changed = asyncio.ensure_future(self._changed.wait())
        stopped = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait((changed, stopped), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            changed.cancel()
            stopped.cancel()
        now = time.monotonic()
        for group in self._groups.values():  # a leader out past its patience (hung, retrying) releases its siblings
            if not group.released and now - group.since >= self.patience_s:
                group.released = True
                self._release(group)
