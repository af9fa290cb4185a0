"""Spare threads for a run's helpers (``orchestrator/core/spare_threads.py``): reused,
named as the helper, surviving a helper's failure, gone when idle, and none taken
across a fork (Celery's prefork pool forks the worker)."""

from __future__ import annotations

import logging
import os
import threading
import time

import pytest

from orchestrator.core.spare_threads import SpareThreads


def _ident_and_name(pool: SpareThreads) -> tuple[int, str]:
    seen: list[tuple[int, str]] = []
    pool.start(lambda: seen.append((threading.get_ident(), threading.current_thread().name)), "helper-x").join(5)
    assert seen, "the helper did not run"
    return seen[0]


def test_a_helper_runs_under_its_name_and_the_next_one_reuses_its_thread() -> None:
    pool = SpareThreads()
    first, name = _ident_and_name(pool)
    assert name == "helper-x"
    assert pool.idle() == 1
    second, _ = _ident_and_name(pool)
    assert second == first
    assert pool.idle() == 1
    thread = next(t for t in threading.enumerate() if t.ident == first)
    assert thread.daemon and thread.name == "spare"  # named as the helper only while it runs


def test_helpers_at_once_each_get_a_thread_and_join_waits_for_the_end() -> None:
    pool = SpareThreads()
    release = threading.Event()
    ran: list[int] = []

    def helper() -> None:
        release.wait(5)
        ran.append(threading.get_ident())

    jobs = [pool.start(helper, f"h{i}") for i in range(3)]
    assert all(job.is_alive() for job in jobs)
    jobs[0].join(0.05)
    assert jobs[0].is_alive()  # a join with a timeout gives up
    release.set()
    for job in jobs:
        job.join(5)
        assert not job.is_alive()
    assert len(set(ran)) == 3
    assert pool.idle() == 3


def test_a_failing_helper_is_logged_and_its_thread_serves_the_next(caplog: pytest.LogCaptureFixture) -> None:
    pool = SpareThreads()

    def boom() -> None:
        raise RuntimeError("broken helper")

    with caplog.at_level(logging.ERROR, logger="orchestrator.core.spare_threads"):
        job = pool.start(boom, "helper-boom")
        job.join(5)
    assert not job.is_alive()
    assert "helper-boom" in caplog.text and "broken helper" in caplog.text
    assert pool.idle() == 1
    _ident_and_name(pool)  # still serves


def test_a_timer_calls_after_its_delay_unless_cancelled() -> None:
    pool = SpareThreads()
    called = threading.Event()
    started = time.monotonic()
    pool.after(0.2, called.set, "t1")
    assert called.wait(5)
    assert time.monotonic() - started >= 0.2

    never = threading.Event()
    timer = pool.after(0.2, never.set, "t2")
    timer.cancel()
    timer.job.join(5)
    assert not timer.job.is_alive() and not never.is_set()


def test_an_idle_thread_ends() -> None:
    pool = SpareThreads(idle_s=0.1)
    ident, _ = _ident_and_name(pool)
    deadline = time.monotonic() + 5
    while any(t.ident == ident for t in threading.enumerate()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not any(t.ident == ident for t in threading.enumerate())
    assert pool.idle() == 0
    _ident_and_name(pool)  # a new one is made


def test_a_forked_child_runs_helpers_on_threads_of_its_own() -> None:
    pool = SpareThreads()
    _ident_and_name(pool)
    assert pool.idle() == 1  # the parent's thread, which the child will not have
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a helper must run here, on a thread that exists here
        try:
            ran = threading.Event()
            job = pool.start(ran.set, "child-helper")
            job.join(5)
            os.write(write, b"ran" if ran.is_set() else b"lost")
        finally:
            os._exit(0)
    os.close(write)
    try:
        assert os.read(read, 16) == b"ran"
    finally:
        os.close(read)
        os.waitpid(pid, 0)
