"""A tool call that never returns does not keep the finished process alive (issue 33, item 3):
the call times out at its deadline, the script ends, and the interpreter exits although the
tool's thread still sleeps (the tools' loop and its executor threads are daemons)."""

import subprocess
import sys
import textwrap
import time

import pytest

SCRIPT = textwrap.dedent(
    """
    import asyncio, sys, time
    from hybridrl.agents.tools.loop import ToolLoopTimeout, run_on_tool_loop

    async def execute():  # a tool whose call never returns
        if sys.argv[1] == "to_thread":
            await asyncio.to_thread(time.sleep, 3600)  # the recommended way to block
        else:
            time.sleep(3600)  # blocking inside async def: stalls the tools' loop itself

    async def main():
        try:
            await run_on_tool_loop(execute(), 0.5, "tool 'sleepy': its execute")
        except ToolLoopTimeout as exc:
            print("deadline:", exc, flush=True)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["to_thread", "blocking"])
def test_the_process_exits_after_a_tool_call_that_never_returns(how):
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", SCRIPT, how], capture_output=True, text=True, timeout=30, check=False)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert "deadline: tool 'sleepy': its execute did not finish within 0.5 s" in done.stdout
    assert took < 20, f"the process took {took:.1f} s to exit after its tool's deadline"


def test_the_tool_loop_executor_runs_calls_and_hands_back_errors():
    from hybridrl.agents.tools.loop import DaemonThreadExecutor

    pool = DaemonThreadExecutor()
    assert pool.submit(pow, 2, 10).result(5) == 1024
    with pytest.raises(ZeroDivisionError):
        pool.submit(divmod, 1, 0).result(5)
    pool.shutdown()  # joins nothing
