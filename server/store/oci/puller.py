"""Pulling a model: each blob's resumable, verified download, and the puller that runs a
whole pull.

`fetch_blob` (BlobDownloads, a part of client.py's RegistryClient) streams one blob into
`blobs_dir/sha256-<hex>.partial`, verifies its size and sha256 and renames it into place; a
download that stopped resumes from its partial. `Puller` runs a whole pull, shares in-flight
downloads of the same blob between concurrent pulls and reports Ollama-shaped progress.

Safety rules kept here, not by callers:
- every file name is derived from a digest that matched DIGEST_RE; nothing the server
  sends ever names a file;
- a blob is in its final place only after its size and sha256 were verified.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import errno
import fcntl
import hashlib
import os
import re
import shutil
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING

from ...system.imports import lazy_import
from .reference import DIGEST_RE, PullError, Reference

if TYPE_CHECKING:                  # client.py imports this module: its names for annotations only
    from .client import Layer, RegistryClient


PROGRESS_INTERVAL = 0.1        # seconds between progress events of one layer
WRITE_BATCH = 1 << 20          # bytes buffered before one write+hash in a worker thread
MAX_BATCHES_IN_FLIGHT = 8      # batches queued to the writer thread before receiving waits
HASH_CHUNK = 4 << 20

httpx = lazy_import("httpx2")  # loaded by the first pull, not by every daemon's start


def _hash_file(path: str, limit: int | None = None) -> tuple[hashlib._Hash, int]:
    h = hashlib.sha256()
    n = 0
    with open(path, "rb") as f:
        while limit is None or n < limit:
            chunk = f.read(HASH_CHUNK if limit is None else min(HASH_CHUNK, limit - n))
            if not chunk:
                break
            h.update(chunk)
            n += len(chunk)
    return h, n


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


# Blobs already verified in this process, by (path, dev, inode, size, mtime): an existing
# blob is hashed once, not at every pull that reuses it.
_VERIFIED: dict[str, tuple[int, int, int, int]] = {}


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns


class _Stall(Exception):
    pass


class BlobDownloads:
    """A RegistryClient's blobs (client.py mixes this in): each one downloaded through the
    client's authenticated requests (_url, _request), resumed from its partial, verified."""

    # ---- blobs

    async def fetch_blob(self, ref: Reference, layer: Layer, blobs_dir: str, *,
                         progress: Callable[[int, int], None] | None = None,
                         disk_reserve: int = 1 << 30) -> str:
        if not isinstance(layer.digest, str) or not DIGEST_RE.fullmatch(layer.digest):
            raise PullError(f"invalid digest {str(layer.digest)[:80]!r}", 400)
        if type(layer.size) is not int or layer.size < 0:
            raise PullError(f"invalid size for {layer.digest}", 400)
        size = layer.size
        if size > self.max_blob_bytes:
            raise PullError(f"blob {layer.digest} is {size} bytes, more than the limit of "
                            f"{self.max_blob_bytes} bytes", 413)
        hexd = layer.digest[len("sha256:"):]
        os.makedirs(blobs_dir, exist_ok=True)
        final = os.path.join(blobs_dir, f"sha256-{hexd}")
        partial = final + ".partial"
        report = progress or (lambda done, total: None)

        if await asyncio.to_thread(self._existing_ok, final, layer):
            report(size, size)
            return final

        have = 0
        with contextlib.suppress(FileNotFoundError):
            have = os.lstat(partial).st_size
        if have > size:
            os.unlink(partial)
            have = 0
        check_disk(blobs_dir, size - have, disk_reserve)

        try:
            fd = os.open(partial, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise PullError(f"cannot create {partial}: {e.strerror}", 507 if e.errno == errno.ENOSPC else 500) from None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise PullError(f"blob {layer.digest} is being downloaded by another client", 409) from None
            try:
                await self._download(ref, layer, fd, partial, report)
            except BaseException:
                # a failure before any byte arrived leaves no empty .partial behind
                with contextlib.suppress(OSError):
                    if os.fstat(fd).st_size == 0:
                        os.unlink(partial)
                raise
            os.replace(partial, final)
        finally:
            os.close(fd)
        _fsync_dir(blobs_dir)
        with contextlib.suppress(OSError):
            _VERIFIED[final] = _stat_key(os.stat(final))
        return final

    @staticmethod
    def _existing_ok(final: str, layer: Layer) -> bool:
        try:
            st = os.stat(final)
        except FileNotFoundError:
            return False
        if _VERIFIED.get(final) == _stat_key(st) and st.st_size == layer.size:
            return True
        ok = st.st_size == layer.size and _hash_file(final)[0].hexdigest() == layer.hex
        if ok:
            _VERIFIED[final] = _stat_key(st)
        else:                                   # corrupt or foreign: replace it
            _VERIFIED.pop(final, None)
            os.unlink(final)
        return ok

    async def _download(self, ref: Reference, layer: Layer, fd: int, partial: str,
                        report: Callable[[int, int], None]) -> None:
        size = layer.size
        have = os.fstat(fd).st_size
        if have > size:
            os.ftruncate(fd, 0)
            have = 0
        hasher = hashlib.sha256()
        if have:
            hasher, have = await asyncio.to_thread(_hash_file, partial, have)

        def discard(message: str) -> PullError:
            with contextlib.suppress(OSError):
                os.unlink(partial)
            return PullError(message)

        if have == size:                      # a complete partial: only verification is left
            report(have, size)
            if hasher.hexdigest() != layer.hex:
                # stale or corrupt bytes: start over once
                os.ftruncate(fd, 0)
                hasher, have = hashlib.sha256(), 0
            else:
                await _blocking(os.fsync, fd)
                return

        url = self._url(ref, "blobs", layer.digest)
        for attempt in range(2):
            headers = {"Accept-Encoding": "identity"}
            if have:
                headers["Range"] = f"bytes={have}-"
            # no byte for stall_timeout, headers included, is a stall
            response = await self._request("GET", url, ref.scope, headers,
                                           httpx.Timeout(self.timeout, read=self.stall_timeout))
            try:
                status = response.status_code
                if status == 404:
                    raise PullError(f"blob {layer.digest} of {ref} not found in the registry")
                if status == 416 and have and attempt == 0:
                    os.ftruncate(fd, 0)        # the server cannot resume: start over
                    hasher, have = hashlib.sha256(), 0
                    continue
                if status == 200:
                    if have:
                        os.ftruncate(fd, 0)    # the server ignored the Range: start over
                        hasher, have = hashlib.sha256(), 0
                elif status == 206 and have:
                    if not _content_range_ok(response.headers.get("Content-Range", ""), have, size):
                        raise discard(f"the registry answered a wrong Content-Range "
                                      f"{response.headers.get('Content-Range', '')[:80]!r} for bytes={have}-")
                else:
                    raise PullError(f"the registry answered {status} for blob {layer.digest}")
                declared = response.headers.get("Content-Length")
                if declared is not None and (not declared.isdigit() or int(declared) != size - have):
                    raise discard(f"the registry declared {declared[:40]} bytes for blob {layer.digest}, "
                                  f"expected {size - have}")
                os.lseek(fd, have, os.SEEK_SET)
                have = await self._stream(response, fd, hasher, have, size, layer, report, discard)
            finally:
                await response.aclose()
            break

        if have != size:
            raise discard(f"blob {layer.digest}: the registry sent {have} bytes, expected {size}")
        if hasher.hexdigest() != layer.hex:
            raise discard(f"blob {layer.digest}: sha256 mismatch (got sha256:{hasher.hexdigest()})")
        await _blocking(os.fsync, fd)

    async def _stream(self, response: httpx.Response, fd: int, hasher, have: int, size: int,
                      layer: Layer, report: Callable[[int, int], None], discard) -> int:
        """Append the body to fd; returns the byte count. A stall keeps what arrived."""
        buf = bytearray()
        writer = _BlobWriter(fd, hasher)

        def flush() -> None:
            if buf:
                data = bytes(buf)
                buf.clear()
                _write_all(fd, data)
                hasher.update(data)

        chunks = response.aiter_raw().__aiter__()
        try:
            while True:
                try:
                    async with asyncio.timeout(self.stall_timeout):
                        chunk = await chunks.__anext__()
                except StopAsyncIteration:
                    break
                except TimeoutError:
                    raise _Stall() from None
                if have + len(buf) + len(chunk) > size:
                    raise discard(f"blob {layer.digest}: the registry sent more than the {size} bytes declared")
                buf += chunk
                if len(buf) >= WRITE_BATCH:
                    data = bytes(buf)
                    buf.clear()
                    await writer.put(data)
                    have += len(data)
                report(have + len(buf), size)
            await writer.drain()
        except (_Stall, httpx.TimeoutException):
            flush_len = len(buf)
            await writer.drain()
            await _blocking(flush)
            await _blocking(os.fsync, fd)
            raise PullError(f"blob {layer.digest}: no data from the registry for {self.stall_timeout:g}s "
                            f"(kept {have + flush_len} of {size} bytes; pulling again resumes)", 504) from None
        except httpx.RemoteProtocolError:
            # the server closed before its Content-Length: a truncated body
            raise discard(f"blob {layer.digest}: the registry closed the connection after "
                          f"{have + len(buf)} of {size} bytes") from None
        except httpx.HTTPError as e:
            flush_len = len(buf)
            await writer.drain()
            await _blocking(flush)
            raise PullError(f"blob {layer.digest}: connection lost after {have + flush_len} bytes "
                            f"({type(e).__name__}); pulling again resumes") from None
        except asyncio.CancelledError:
            writer.close()                     # the caller closes fd next: finish writes first
            with contextlib.suppress(OSError, PullError):
                flush()                        # keep what arrived for a later resume
            raise
        finally:
            writer.close()
        n = len(buf)
        await _blocking(flush)
        return have + n


async def _blocking(fn, *args):
    """Run fn in a worker thread. If cancelled, wait for the thread anyway before
    re-raising: fn uses a file descriptor that the caller closes right after."""
    task = asyncio.ensure_future(asyncio.to_thread(fn, *args))
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        while not task.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait([task])
        raise


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            n = os.write(fd, view)
        except OSError as e:
            raise PullError(f"cannot write the blob: {e.strerror}", 507 if e.errno == errno.ENOSPC else 500) from None
        view = view[n:]


class _BlobWriter:
    """Writes and hashes batches, in order, on one worker thread while the event loop keeps
    receiving: the network read never waits for sha256, which inline halves a pull."""

    def __init__(self, fd: int, hasher):
        self.fd, self.hasher = fd, hasher
        self._executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="blob-writer")
        self._pending: collections.deque = collections.deque()

    async def put(self, data: bytes) -> None:
        self._pending.append(self._executor.submit(_write_and_hash, self.fd, self.hasher, data))
        if len(self._pending) > MAX_BATCHES_IN_FLIGHT:
            await asyncio.wrap_future(self._pending.popleft())

    async def drain(self) -> None:
        """Wait for every queued batch; a failed write raises here."""
        while self._pending:
            await asyncio.wrap_future(self._pending.popleft())

    def close(self) -> None:
        self._executor.shutdown(wait=True)
        self._pending.clear()


def _write_and_hash(fd: int, hasher, data: bytes) -> None:
    _write_all(fd, data)
    hasher.update(data)


def _content_range_ok(header: str, start: int, size: int) -> bool:
    m = re.fullmatch(r"\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*", header)
    if not m:
        return False
    first, last, total = int(m.group(1)), int(m.group(2)), m.group(3)
    return first == start and last == size - 1 and (total == "*" or int(total) == size)


def check_disk(blobs_dir: str, needed: int, disk_reserve: int) -> None:
    """PullError 507 unless `needed` bytes fit in blobs_dir's free space above disk_reserve."""
    if needed <= 0:
        return
    free = shutil.disk_usage(blobs_dir).free
    if needed > free - disk_reserve:
        raise PullError(f"not enough disk space in {blobs_dir}: the model needs {needed} bytes, "
                        f"{free} are free and {disk_reserve} are kept in reserve", 507)


# ---------------------------------------------------------------- shared pulls

class _Download:
    def __init__(self, layer: Layer):
        self.layer = layer
        self.completed = 0
        self.waiters = 0
        self.listeners: set[asyncio.Event] = set()
        self.task: asyncio.Task | None = None

    def progress(self, completed: int, total: int) -> None:
        self.completed = completed
        for event in self.listeners:
            event.set()

    def wake(self, _task=None) -> None:
        for event in self.listeners:
            event.set()


class Puller:
    """Shares downloads: two pulls needing the same blob at once use one download."""

    def __init__(self, client_factory: Callable[[], RegistryClient], blobs_dir: str,
                 disk_reserve: int = 1 << 30):
        self.client_factory = client_factory
        self.blobs_dir = blobs_dir
        self.disk_reserve = disk_reserve
        self._inflight: dict[str, _Download] = {}

    async def pull(self, ref: Reference) -> AsyncIterator[dict]:
        yield {"status": "pulling manifest"}
        client = self.client_factory()
        try:
            manifest = await client.manifest(ref)
            max_blob = client.max_blob_bytes
        finally:
            await client.aclose()
        manifest.model_layer                    # exactly one GGUF layer, or PullError
        blobs = manifest.blobs()
        for layer in blobs:
            if layer.size > max_blob:
                raise PullError(f"blob {layer.digest} is {layer.size} bytes, more than the limit of "
                                f"{max_blob} bytes", 413)
        os.makedirs(self.blobs_dir, exist_ok=True)
        check_disk(self.blobs_dir, self._missing_bytes(blobs), self.disk_reserve)
        for layer in blobs:
            async with contextlib.aclosing(self._follow(ref, layer)) as events:
                async for event in events:
                    yield event
        yield {"status": "verifying sha256 digest"}
        yield {"status": "writing manifest"}
        yield {"status": "success", "manifest": manifest}

    def _missing_bytes(self, blobs: list[Layer]) -> int:
        missing = 0
        for layer in blobs:
            if layer.digest in self._inflight:
                continue
            final = os.path.join(self.blobs_dir, f"sha256-{layer.hex}")
            if os.path.exists(final):
                continue
            try:
                have = os.lstat(final + ".partial").st_size
            except FileNotFoundError:
                have = 0
            missing += layer.size - have if have <= layer.size else layer.size
        return missing

    def _start(self, ref: Reference, layer: Layer) -> _Download:
        download = self._inflight.get(layer.digest)
        if download is not None and download.layer.size == layer.size:
            return download
        download = _Download(layer)

        async def run() -> str:
            client = self.client_factory()
            try:
                return await client.fetch_blob(ref, layer, self.blobs_dir, progress=download.progress,
                                               disk_reserve=self.disk_reserve)
            finally:
                await client.aclose()

        download.task = asyncio.get_running_loop().create_task(run(), name=f"pull {layer.digest[:19]}")

        def done(task: asyncio.Task) -> None:
            if self._inflight.get(layer.digest) is download:
                del self._inflight[layer.digest]
            download.wake()
            if not task.cancelled():
                task.exception()                # retrieved here; waiters re-raise it
        download.task.add_done_callback(done)
        self._inflight[layer.digest] = download
        return download

    async def _follow(self, ref: Reference, layer: Layer) -> AsyncIterator[dict]:
        download = self._start(ref, layer)
        status = f"pulling {layer.hex[:12]}"
        event = asyncio.Event()
        download.listeners.add(event)
        download.waiters += 1
        task = download.task
        try:
            last = -1
            while not task.done():
                if download.completed != last:
                    last = download.completed
                    yield {"status": status, "digest": layer.digest, "total": layer.size, "completed": last}
                    await asyncio.wait([task], timeout=PROGRESS_INTERVAL)
                    continue
                await event.wait()
                event.clear()
            if task.cancelled():
                raise PullError(f"the download of {layer.digest} was cancelled")
            task.result()
            yield {"status": status, "digest": layer.digest, "total": layer.size, "completed": layer.size}
        finally:
            download.listeners.discard(event)
            download.waiters -= 1
            if download.waiters == 0 and not task.done():
                task.cancel()                   # nobody wants it any more; the partial stays
