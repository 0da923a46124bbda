"""The leak checks every test gets (conftest.py): a test that leaves a
thread or a task running fails, one that says why it may leave a thread
does not. Run on a small test file of their own, in a child pytest."""

from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

HERE = Path(__file__).resolve().parent

LEAKY = '''
import asyncio, threading, time
import anyio, pytest

pytestmark = pytest.mark.anyio

stop = threading.Event()

async def test_tidy():
    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.sleep, 0.01)

async def test_leaves_a_task():
    asyncio.get_running_loop().create_task(anyio.sleep(30), name="left-behind")

def test_leaves_a_thread():
    threading.Thread(target=stop.wait, args=(30,), name="left-running", daemon=True).start()

@pytest.mark.leaves_thread("by-design", reason="a reader that cannot be woken, on purpose")
def test_says_why_it_leaves_a_thread():
    threading.Thread(target=stop.wait, args=(30,), name="by-design", daemon=True).start()
'''


def test_a_test_that_leaves_a_thread_or_a_task_running_fails(pytester):
    pytester.makeconftest((HERE / "conftest.py").read_text())
    pytester.makepyfile(leaks=(HERE / "leaks.py").read_text(), test_leaky=LEAKY)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rfE")
    result.assert_outcomes(passed=3, failed=1, errors=1)  # a thread fails at teardown: an error
    result.stdout.fnmatch_lines([
        "*ERROR at teardown of test_leaves_a_thread*",
        "the test left 1 thread(s) running: 'left-running' *",
        "*test_leaves_a_task*",
        "the test left 1 task(s) running: left-behind *",
    ])
