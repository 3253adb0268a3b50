"""A web page that talks STOMP over WebSocket to pymq, with Python on the other side.

    browser (index.html + @stomp/stompjs) ⇄ ws://…/stomp ⇄ pymq broker ⇄ Python (pymq.aio: ticks, chat)

Run it:
    cd examples/browser && npm install @stomp/stompjs     # once: the UMD bundle the page loads
    python examples/browser/serve.py                      # then open the page address it prints

It starts a broker in this process (STOMP on --stomp-port, WebSocket on --ws-port, data in a temporary
directory), serves the page and ``stomp.umd.js`` on --http-port, publishes a tick to ``/topic/ticks``
every second, and prints every chat line the page sends to ``/topic/chat`` (and greets it back).  The
WebSocket listener accepts only this page's origin (``websocket.allowed_origins``).  Ctrl-C stops it.
``--stompjs`` (or ``PYMQ_STOMPJS``) names the bundle when it is not in ./node_modules.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time

from aiohttp import web

import pymq
import pymq.aio
from pymq_server.app import BrokerServer
from pymq_server.config import BrokerConfig

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_BUNDLE = os.path.join(HERE, "node_modules", "@stomp", "stompjs", "bundles", "stomp.umd.js")


async def serve_page(host: str, port: int, bundle: str, config: dict) -> tuple[web.AppRunner, int]:
    async def index(request):
        return web.FileResponse(os.path.join(HERE, "index.html"))

    async def stompjs(request):
        return web.FileResponse(bundle, headers={"Content-Type": "text/javascript"})

    async def page_config(request):
        return web.json_response(config)

    app = web.Application()
    app.router.add_get("/", index)
    app.router.add_get("/stomp.umd.js", stompjs)
    app.router.add_get("/config.json", page_config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return runner, site._server.sockets[0].getsockname()[1]


async def python_side(url: str, stop: asyncio.Event) -> None:
    """Ticks out every second; chat lines from the page printed and answered."""
    async with pymq.aio.connect(url) as conn:
        ticks = conn.create_session().create_producer(pymq.Topic("ticks"))
        chat_session = conn.create_session()
        chat = await chat_session.create_consumer(pymq.Topic("chat"), "sender = 'browser'")
        answer = chat_session.create_producer(pymq.Topic("chat"))

        async def on_chat(message) -> None:
            print(f"page says: {message.text}", flush=True)
            await answer.send(pymq.TextMessage(f"Python got {message.text!r}", properties={"sender": "python"}))

        chat.set_message_listener(on_chat)
        n = 0
        while not stop.is_set():
            n += 1
            await ticks.send(f"tick {n} at {time.strftime('%H:%M:%S')}")
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except asyncio.TimeoutError:
                pass


async def main_async(args) -> int:
    bundle = args.stompjs or os.environ.get("PYMQ_STOMPJS") or DEFAULT_BUNDLE
    if not os.path.exists(bundle):
        print(f"no @stomp/stompjs bundle at {bundle}: run `npm install @stomp/stompjs` in {HERE}, or pass "
              f"--stompjs", file=sys.stderr)
        return 2
    host = "127.0.0.1"
    # the page's origin is only known once its port is: bind the page first, tell it the broker's later
    page_config: dict = {}
    page_runner, http_port = await serve_page(host, args.http_port, bundle, page_config)
    origin = f"http://{host}:{http_port}"
    config = BrokerConfig(host=host, port=args.stomp_port, data_dir=tempfile.mkdtemp(prefix="pymq-browser-"),
                          websocket={"port": args.ws_port, "allowed_origins": [origin]})
    server = BrokerServer(config)
    await server.start()
    ws_url = f"ws://{host}:{server.websocket_port}/stomp"
    page_config.update(ws=ws_url, login="guest", passcode="guest")
    print(f"page:   {origin}/", flush=True)
    print(f"broker: stomp://{host}:{server.port}  {ws_url}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await python_side(f"stomp://{host}:{server.port}", stop)
    finally:
        await page_runner.cleanup()
        await server.stop()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--http-port", type=int, default=8000, help="the page (default 8000)")
    parser.add_argument("--ws-port", type=int, default=15674, help="STOMP over WebSocket (default 15674)")
    parser.add_argument("--stomp-port", type=int, default=61613, help="STOMP over TCP (default 61613)")
    parser.add_argument("--stompjs", help="path of @stomp/stompjs's bundles/stomp.umd.js")
    return asyncio.run(main_async(parser.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
