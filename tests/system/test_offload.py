"""Off-loop work that is not template code runs beside the loop at the loop's own OS priority:
a lower-priority thread preempted while it holds the GIL stalls the loop (offload.py)."""
import asyncio
import contextlib
import os
import threading

from stackd.api.inference import generate
from stackd.system import offload
from stackd.chat import templates


def where() -> tuple[str, int]:
    """The calling thread's name and niceness (Linux keeps a niceness per thread)."""
    return threading.current_thread().name, os.getpriority(os.PRIO_PROCESS, threading.get_native_id())


def test_offloaded_work_runs_on_another_thread_at_the_loops_priority():
    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    name, nice = asyncio.run(offload.run(where))
    assert name.startswith(offload.THREAD_NAME) and name != threading.current_thread().name
    assert nice == loop_nice


def test_render_threads_stay_below_the_loops_priority():
    """The other side of the split: template code is what gives way to the engines."""
    async def on_a_render_thread():
        return await asyncio.get_running_loop().run_in_executor(templates._pool, where)

    loop_nice = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    name, nice = asyncio.run(on_a_render_thread())
    assert name.startswith("stackd-render")
    assert nice > loop_nice or loop_nice >= templates.RENDER_NICE    # (a suite run under nice)


class Runner:
    def lease(self):
        return contextlib.nullcontext("engine")


class Model:
    runner = Runner()
    engine = "engine"


class Request:
    def __init__(self, n_bytes: int):
        self.body = b"x" * n_bytes


def test_large_inputs_are_tokenized_on_an_offload_thread_small_ones_on_the_loop():
    def parse(body, engine):
        return where()

    large = asyncio.run(generate.tokenized(Model(), parse, {}, Request(generate.OFF_LOOP_BYTES + 1)))
    assert large[0].startswith(offload.THREAD_NAME)
    assert large[1] == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    async def small():
        return await generate.tokenized(Model(), parse, {}, Request(generate.OFF_LOOP_BYTES))

    assert asyncio.run(small())[0] == threading.current_thread().name
