"""Bounded work too large for the event loop, on threads at the loop's own OS priority.

Tokenizing a 1 MiB prompt or 2,048 embedding inputs, or serializing 2,048 vectors, takes
milliseconds that every other client would wait through if it ran on the loop. It runs here.

Not on the render threads (templates.py): they run at a lower OS priority, so that a hostile
template gives the cores to the engines. A low-priority thread that holds the GIL when the
scheduler preempts it holds the loop up for as long as the scheduler keeps it off a core:
under a busy embedding worker, the loop slept on the GIL for 0.4-0.7 s while a render thread
that had been tokenizing sat runnable (perf sched timehist). Work that holds the GIL beside the
loop, and is not hostile code, runs at the loop's priority.
"""
from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

THREADS = 2
THREAD_NAME = "stackd-offload"

_pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix=THREAD_NAME)


async def run(function, *args):
    """`function(*args)` on an offload thread; the loop serves other clients meanwhile."""
    return await asyncio.get_running_loop().run_in_executor(_pool, function, *args)
