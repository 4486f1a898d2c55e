"""Off-loop work that is not template code runs beside the loop at the loop's own OS priority:
a lower-priority thread preempted while it holds the GIL stalls the loop (offload.py)."""
import asyncio
import os
import threading

import pytest

from stackd.api.inference import generate
from stackd.runtime.runner import ON_LOOP_CHARS, ModelRunner
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


class InlineEngine:
    """An engine in this process, as far as the runner's tokenizing sees it."""
    isolation = "inline"

    def __init__(self):
        self.read_end, self.write_end = os.pipe()

    def fileno(self):
        return self.read_end

    def tokenize(self, text, add_special, parse_special):
        return [where()]


def test_an_inline_engine_tokenizes_long_texts_on_an_offload_thread_short_ones_on_the_loop():
    async def tokenized_where(n_chars: int):
        engine = InlineEngine()
        runner = ModelRunner(asyncio.get_running_loop(), engine)
        try:
            return (await runner.tokenize(["x" * n_chars], True, False))[0][0]
        finally:
            asyncio.get_running_loop().remove_reader(engine.fileno())
            os.close(engine.read_end)
            os.close(engine.write_end)

    name, nice = asyncio.run(tokenized_where(ON_LOOP_CHARS + 1))
    assert name.startswith(offload.THREAD_NAME)
    assert nice == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert asyncio.run(tokenized_where(ON_LOOP_CHARS))[0] == threading.current_thread().name


class Runner:
    async def tokenize(self, texts, add_special, parse_special):
        return [[len(text)] for text in texts]


class Model:
    runner = Runner()

    class engine:
        n_vocab = 100


class Request:
    def __init__(self, n_bytes: int):
        self.body = b"x" * n_bytes


def test_large_bodies_have_their_token_arrays_checked_on_an_offload_thread_small_ones_on_the_loop():
    def checked_where(n_bytes: int):
        seen = []

        def outside_vocabulary(i):
            seen.append((i, where()))
            return ValueError(i)

        with pytest.raises(ValueError):
            asyncio.run(generate.tokenized(Model(), ["text", [1, 2], [3, 100]], Request(n_bytes),
                                           True, False, outside_vocabulary))
        return seen[0]

    index, (name, nice) = checked_where(generate.OFF_LOOP_BYTES + 1)
    assert index == 2 and name.startswith(offload.THREAD_NAME)
    assert nice == os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert checked_where(generate.OFF_LOOP_BYTES)[1][0] == threading.current_thread().name


def test_texts_go_to_the_runner_in_one_call_and_come_back_in_their_places():
    tokens = asyncio.run(generate.tokenized(Model(), ["ab", [7, 8], "cde"], Request(10), True, True,
                                            ValueError))
    assert tokens == [[2], [7, 8], [3]]
