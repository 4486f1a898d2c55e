"""The server over real loopback sockets: graceful shutdown and the connection cap."""
import asyncio


from .fake import make_server, parse_responses


async def _request(port: int, target: bytes) -> tuple[bytes, bool]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"GET " + target + b" HTTP/1.1\r\nHost: t\r\n\r\n")
    data = await reader.read(65536)
    closed = (await reader.read(1)) == b""
    writer.close()
    return data, closed


async def _shutdown_during(loop, slow_ms: int, grace: float):
    """A server shut down with `grace` while a request that takes `slow_ms` is in flight ->
    (server, port, the request's (bytes, closed))."""
    server, app = make_server(loop)
    port = await server.listen(app, "127.0.0.1", 0)
    in_flight = asyncio.ensure_future(_request(port, b"/slow?ms=%d" % slow_ms))
    await asyncio.sleep(0.1)
    await server.shutdown(grace=grace)
    return server, port, await in_flight


def test_shutdown_lets_in_flight_requests_finish(loop):
    async def scenario():
        _, port, (data, closed) = await _shutdown_during(loop, 300, 5.0)
        try:
            await asyncio.open_connection("127.0.0.1", port)
            refused = False
        except OSError:
            refused = True
        return data, closed, refused

    data, closed, refused = loop.run_until_complete(scenario())
    [(status, headers, _)] = parse_responses(data)
    assert status == 200 and headers[b"connection"] == b"close"
    assert closed and refused


def test_shutdown_cuts_requests_that_outlive_the_grace(loop):
    async def scenario():
        server, _, (data, _) = await _shutdown_during(loop, 10000, 0.3)
        return data, len(server.connections)

    data, remaining = loop.run_until_complete(scenario())
    assert data == b"" and remaining == 0


def test_idle_keep_alive_connections_close_at_shutdown(loop):
    async def scenario():
        server, app = make_server(loop)
        port = await server.listen(app, "127.0.0.1", 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /echo HTTP/1.1\r\n\r\n")
        await reader.readuntil(b'"params":{}}')
        await server.shutdown(grace=5.0)
        return await asyncio.wait_for(reader.read(1), 2.0)

    assert loop.run_until_complete(scenario()) == b""
