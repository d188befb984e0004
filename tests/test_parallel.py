"""Work in a forked child: its items in order, its errors raised in the parent, and a child not read to its end
stopped rather than waited for."""

import os
import signal
import time

import pytest

from evalpipe import parallel
from evalpipe.errors import BadInput, OutputUnwritable

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork on this platform: the work runs in-process")


def numbers(n):
    for i in range(n):
        yield {"i": i, "pid": os.getpid()}


@pytest.mark.parametrize("read_ahead", [False, True])
def test_items_come_back_in_order_from_another_process(read_ahead):
    got = list(parallel.in_child(lambda: numbers(50_000), read_ahead=read_ahead))  # more than a pipe holds
    assert [item["i"] for item in got] == list(range(50_000))
    assert {item["pid"] for item in got} != {os.getpid()}


@pytest.mark.parametrize("read_ahead", [False, True])
def test_read_ahead_lets_the_child_finish_before_its_items_are_asked_for(tmp_path, read_ahead):
    done = tmp_path / "done"

    def produce():
        yield from numbers(50_000)  # more than a pipe holds
        done.touch()

    items = parallel.in_child(produce, read_ahead=read_ahead)
    deadline = time.monotonic() + (10 if read_ahead else 1)
    while not done.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert done.exists() == read_ahead  # else it waits for this process to read
    assert [item["i"] for item in items] == list(range(50_000))


def failing():
    yield 1
    raise BadInput("no question", "data.jsonl", 12)


def test_bad_input_in_the_child_is_raised_here_with_its_file_and_line():
    child = iter(parallel.in_child(failing))
    assert next(child) == 1
    with pytest.raises(BadInput) as caught:
        next(child)
    assert (caught.value.path, caught.value.line, str(caught.value)) == ("data.jsonl", 12, "data.jsonl:12: no question")


def unwritable():
    raise OutputUnwritable("out.json", OSError(28, "No space left on device"))
    yield


def test_other_errors_keep_their_message_and_exit_code():
    with pytest.raises(Exception) as caught:
        list(parallel.in_child(unwritable))
    assert caught.value.exit_code == OutputUnwritable("out.json", OSError(28, "x")).exit_code
    assert "No space left on device" in str(caught.value)
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):
        parallel.call_in_child(lambda: 1 / 0)()


def killed_midway():
    yield "first"
    os.kill(os.getpid(), signal.SIGKILL)
    yield "never"


def test_a_child_killed_midway_is_an_error_not_a_short_result():
    with pytest.raises(RuntimeError, match="stopped before its end"):
        list(parallel.in_child(killed_midway))


def forever():
    while True:
        yield 0
        time.sleep(0.01)


@pytest.mark.parametrize("read_ahead", [False, True])
def test_closing_a_child_not_read_to_its_end_stops_it(read_ahead):
    child = parallel.in_child(forever, read_ahead=read_ahead)
    assert next(iter(child)) == 0
    started = time.monotonic()
    child.close()
    assert time.monotonic() - started < 5
    with pytest.raises(ChildProcessError):
        os.waitpid(child.pid, os.WNOHANG)  # reaped: no zombie left


def test_a_call_gives_its_result():
    assert parallel.call_in_child(lambda: sum(range(10)))() == 45


def test_without_fork_the_items_are_made_here_as_they_are_read(monkeypatch):
    monkeypatch.delattr(os, "fork")
    made = []

    def produce():
        for i in range(5):
            made.append(i)
            yield i

    items = parallel.in_child(produce, read_ahead=True)
    assert made == []  # nothing is made before it is read
    reading = iter(items)
    assert [next(reading), next(reading)] == [0, 1] and made == [0, 1]
    items.close()
    assert list(reading) == [] and made == [0, 1]
    assert parallel.call_in_child(lambda: os.getpid())() == os.getpid()
