"""`continuum-router serve` as a process: SIGHUP reloads the file, SIGTERM drains and exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import yaml

from continuum_testing.ingress_harness import stub_backends
from continuum_testing.upstream_stub import running_stubs


async def test_serve_reloads_on_sighup_and_exits_on_sigterm(tmp_path: Path) -> None:
    path = tmp_path / "router.yaml"
    async with running_stubs("a", "b") as stubs:
        path.write_text(yaml.safe_dump({"backends": stub_backends(stubs[:1], models=["first"])}))
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "continuum_router", "serve", "--config", str(path), "--port", "0",
            "--watch-interval", "0",
            env={**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        try:
            async with asyncio.timeout(30):
                line = (await proc.stdout.readline()).decode()
            match = re.search(r"listening on (http://\S+)", line)
            assert match, line
            url = match.group(1)
            async with httpx.AsyncClient(base_url=url) as client:
                assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["first"]
                path.write_text(yaml.safe_dump({"backends": stub_backends(stubs, models=["second"])}))
                await asyncio.sleep(0.2)
                # Only the signal reloads (file watching is off).
                assert [m["id"] for m in (await client.get("/v1/models")).json()["data"]] == ["first"]
                proc.send_signal(signal.SIGHUP)
                for _ in range(100):
                    models = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
                    if models == ["second"]:
                        break
                    await asyncio.sleep(0.05)
                assert models == ["second"]
                body = {"model": "second", "messages": [{"role": "user", "content": "hi"}]}
                served = {
                    (await client.post("/v1/chat/completions", json=body)).headers["x-continuum-backend"]
                    for _ in range(4)
                }
                assert served == {"a", "b"}
        finally:
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
            async with asyncio.timeout(30):
                code = await proc.wait()
        assert code == 0
