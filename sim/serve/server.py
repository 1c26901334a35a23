"""Running a server: the HTTP site and the serving loop side by side, and a clean shutdown.

Shutdown (Ctrl-C, or `stop()`): the loop finishes the step in flight, every
open stream is ended (`finish_reason: abort`, then `data: [DONE]`), the site
closes, and the served requests are summarised in `servesim run`'s files
(requests.csv, summary.json, timeseries.csv; sim.experiments.outputs).
`BackgroundServer` runs the same thing on a thread, for tests and notebooks.
"""

from __future__ import annotations

import asyncio
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from sim.assemble import ReplicaParts
from sim.config.scenario import Scenario
from sim.core.kv import KVBudget
from sim.results.files.run import RunResult
from sim.results.files.summary import run_summary
from sim.serve.app import ServedModel, build_app
from sim.serve.kv_events import CacheObserver, KVEventsConfig, ZmqPublisher
from sim.serve.loop import ServeLoop
from sim.serve.simulated import build_simulated
from sim.serve.stepper import StepDone
from sim.text.base import Tokenizer


@dataclass(frozen=True, slots=True)
class Served:
    """What a server needs to start and to summarise itself at the end."""

    loop: ServeLoop
    model: ServedModel
    scenario: Scenario
    budget: KVBudget
    latency_name: str
    kv_events: KVEventsConfig | None = None  # publish KV events (sim.serve.kv_events)


def simulated_served(scenario: Scenario, tokenizer: Tokenizer, base_dir: Path | None = None,
                     model_name: str | None = None, api_key: str | None = None,
                     on_step: Callable[[StepDone], None] | None = None,
                     engine_index: int = 0, kv_events: KVEventsConfig | None = None
                     ) -> Served:
    """The simulated backend of `scenario` behind a loop, ready for a Server."""
    backend = build_simulated(scenario, tokenizer, base_dir)
    loop = ServeLoop(backend.stepper, tokenizer, on_step, backend.max_model_len, engine_index)
    model = ServedModel(model_name or scenario.model_spec.name, backend.max_model_len, api_key)
    return Served(loop, model, scenario, backend.budget, backend.latency_name, kv_events)


class Server:
    """One server on an asyncio event loop: `start()` binds, `stop()` shuts down cleanly."""

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 8000) -> None:
        self.served, self.host, self.port = served, host, port
        self._runner: web.AppRunner | None = None
        self._task: asyncio.Task | None = None
        self._publisher: ZmqPublisher | None = None
        self._observer: CacheObserver | None = None
        self._started_s = 0.0

    async def start(self) -> int:
        """Bind and serve; returns the port (a free one when asked for port 0)."""
        app = build_app(self.served.loop, self.served.model)
        self._runner = web.AppRunner(app, handler_cancellation=True, access_log=None,
                                     shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        sockets = site._server.sockets if site._server is not None else []  # noqa: SLF001
        self.port = sockets[0].getsockname()[1] if sockets else self.port
        self._started_s = time.perf_counter()
        loop = self.served.loop
        if self.served.kv_events is not None:
            self._publisher = ZmqPublisher(self.served.kv_events)
            self._observer = CacheObserver(loop.stepper.kv, self._publisher.send, loop.tokens_of)
            loop.kv_observer = self._observer.observe
        self._task = asyncio.get_running_loop().create_task(loop.run())
        return self.port

    async def stop(self) -> None:
        self.served.loop.stop()
        if self._task is not None:
            await self._task
        await asyncio.sleep(0.05)  # let handlers write their last events
        if self._runner is not None:
            await self._runner.cleanup()
        if self._observer is not None and self._publisher is not None:
            self._observer.clear()
            self._publisher.close()

    def result(self) -> RunResult:
        """The served requests and steps as a run's result (the files of `servesim run`)."""
        served, loop = self.served, self.served.loop
        stepper = loop.stepper
        replica = ReplicaParts(stepper.kv, stepper.scheduler)
        wall_s = time.perf_counter() - self._started_s
        summary = run_summary(served.scenario, served.budget, loop.recorder, [replica],
                              served.latency_name, wall_s, [loop.recorder])
        return RunResult(served.scenario, summary, loop.recorder, served.budget,
                         replica.kv.num_usable_blocks, served.latency_name, wall_s,
                         (loop.recorder,))


def serve_forever(served: Served, host: str, port: int,
                  on_ready: Callable[[int], None] | None = None) -> Server:
    """Serve until Ctrl-C (SIGINT) or SIGTERM; returns the stopped server (its result() is
    what was served). The handlers are installed even where SIGINT was ignored (a
    background job), so a server always stops cleanly."""
    server = Server(served, host, port)

    async def main() -> None:
        bound = await server.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if on_ready is not None:
            on_ready(bound)
        try:
            await stop.wait()
        finally:
            await server.stop()

    asyncio.run(main())
    return server


class BackgroundServer:
    """A Server on its own thread and event loop: `with BackgroundServer(served) as url:`."""

    def __init__(self, served: Served, host: str = "127.0.0.1") -> None:
        self.server = Server(served, host, 0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        port = asyncio.run_coroutine_threadsafe(self.server.start(), self._loop).result(30)
        return f"http://{self.server.host}:{port}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the server's event loop (the loop's state is not thread-safe)."""
        async def run() -> object:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), self._loop).result(30)


def write_served(server: Server, out_dir: Path, plots: bool) -> list[Path]:
    """requests.csv, summary.json and the rest of a run's files, for what was served."""
    from sim.experiments.outputs import write_outputs

    return write_outputs(server.result(), out_dir, plots=plots)
