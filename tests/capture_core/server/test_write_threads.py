"""The capture server's write threads: results, errors, cancellation, bounds and shutdown."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from capture_core.server.write_threads import WriteThreads


def test_results_and_errors_reach_the_awaiting_task() -> None:
    pool = WriteThreads(2, name="t")

    def fail() -> None:
        raise OSError(28, "No space left on device")

    async def main() -> tuple[int, str]:
        total = await pool.run(sum, (1, 2, 3))
        with pytest.raises(OSError, match="No space"):
            await pool.run(fail)
        name = await pool.run(lambda: threading.current_thread().name)
        return total, name

    total, name = asyncio.run(main())
    pool.shutdown()
    assert total == 6
    assert name.startswith("t_")


def test_a_cancelled_job_still_runs_and_its_result_is_dropped() -> None:
    pool = WriteThreads(1, name="t")
    ran = threading.Event()
    gate = threading.Event()

    def write() -> int:
        gate.wait(5)
        ran.set()
        return 1

    async def main() -> None:
        future = pool.run(write)
        future.cancel()
        gate.set()
        # The job runs to the end although nobody waits for it (a line must still land).
        await asyncio.get_running_loop().run_in_executor(None, ran.wait, 5)
        await asyncio.sleep(0.05)  # its result arrives on a cancelled future: no error raised
        assert future.cancelled()

    asyncio.run(main())
    pool.shutdown()
    assert ran.is_set()


def test_threads_grow_with_jobs_up_to_the_limit() -> None:
    pool = WriteThreads(3, name="t")
    running = 0
    most = 0
    lock = threading.Lock()

    def job() -> None:
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    async def main() -> None:
        await asyncio.gather(*(pool.run(job) for _ in range(12)))

    asyncio.run(main())
    pool.shutdown()
    assert most == 3
    assert len(pool._threads) == 3


def test_shutdown_lets_queued_jobs_finish_and_refuses_new_ones() -> None:
    pool = WriteThreads(1, name="t")
    done: list[int] = []

    async def main() -> None:
        for i in range(5):
            pool.run(lambda i=i: (time.sleep(0.01), done.append(i)))
        await asyncio.sleep(0)

    asyncio.run(main())
    pool.shutdown(wait=True)
    assert done == [0, 1, 2, 3, 4]

    async def after() -> None:
        pool.run(int)

    with pytest.raises(RuntimeError, match="after shutdown"):
        asyncio.run(after())


def test_at_least_one_thread() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        WriteThreads(0, name="t")
