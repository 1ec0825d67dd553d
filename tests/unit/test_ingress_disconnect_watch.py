"""DisconnectWatch: the request's task is cancelled when its client goes away before the response
is finished, through the router's HTTP protocol's hook or, under another server, a watcher on receive."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from continuum_ingress.asgi import Channel, DisconnectHook, DisconnectWatch


async def _sent(_message: Any) -> None:
    return None


async def _served(watch_args: tuple[Any, ...], trigger: Any, *, finishing: bool = False) -> tuple[bool, bool]:
    """Run a request that waits for ever inside the watch; `trigger(channel)` simulates the
    client leaving. Returns (cancelled, watch.disconnected)."""
    channel = Channel(_sent)
    channel.finishing = finishing
    started = asyncio.Event()
    holder: dict[str, DisconnectWatch] = {}

    async def request() -> None:
        with DisconnectWatch(*watch_args[:1], channel, *watch_args[1:]) as watch:
            holder["watch"] = watch
            started.set()
            await asyncio.sleep(3600)

    task = asyncio.create_task(request())
    await started.wait()
    await trigger()
    try:
        await asyncio.wait_for(task, 1.0)
    except asyncio.CancelledError:
        return True, holder["watch"].disconnected
    except TimeoutError:
        return False, holder["watch"].disconnected
    return False, holder["watch"].disconnected


async def _never() -> dict[str, Any]:
    await asyncio.sleep(3600)
    return {"type": "http.disconnect"}


async def test_the_hook_cancels_the_request_when_the_connection_is_lost() -> None:
    hook = DisconnectHook(asyncio.get_running_loop())

    async def lose() -> None:
        hook.fire()

    cancelled, disconnected = await _served((_never, hook), lose)
    assert cancelled and disconnected
    assert hook.callback is None  # unregistered: a later fire() reaches nobody


async def test_the_hook_leaves_a_finishing_response_alone() -> None:
    hook = DisconnectHook(asyncio.get_running_loop())

    async def lose() -> None:
        hook.fire()

    cancelled, disconnected = await _served((_never, hook), lose, finishing=True)
    assert not cancelled and not disconnected


async def test_without_a_hook_a_watcher_waits_for_http_disconnect() -> None:
    gone = asyncio.Event()

    async def receive() -> dict[str, Any]:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def lose() -> None:
        gone.set()

    cancelled, disconnected = await _served((receive,), lose)
    assert cancelled and disconnected


@pytest.mark.parametrize("with_hook", [True, False])
async def test_leaving_the_watch_stops_watching(with_hook: bool) -> None:
    hook = DisconnectHook(asyncio.get_running_loop()) if with_hook else None
    channel = Channel(_sent)
    with DisconnectWatch(_never, channel, hook) as watch:
        pass
    if hook is not None:
        assert hook.callback is None
    else:
        await asyncio.sleep(0)
        assert watch._watcher is not None and watch._watcher.cancelled()
