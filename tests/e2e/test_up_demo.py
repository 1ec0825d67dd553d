"""`continuum-router up --demo` as a newcomer runs it: a real process, real NATS, real HTTP."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sys
from pathlib import Path

import httpx
import openai

from continuum_testing.up_process import read_until


async def test_up_demo_serves_requests_and_stops_cleanly_on_sigint(tmp_path: Path) -> None:
    env = {**os.environ, "CONTINUUM_LOG_LEVEL": "WARNING"}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "continuum_router", "up", "--demo", "--port", "0",
        cwd=tmp_path, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    try:
        match, _ = await read_until(proc.stdout, r"Continuum is up on (http://\S+)", 60)
        url = match.group(1)
        # The banner's snippets follow: read the rest of it.
        _, banner = await read_until(proc.stdout, r"Ctrl-C stops everything", 5)
        bodies = re.findall(rf"curl -si {re.escape(url)}/v1/chat/completions .* -d '(\{{.*\}})'", banner)
        assert len(bodies) == 2  # a conversation's first turn and its next one
        assert f'OpenAI(base_url="{url}/v1"' in banner
        async with httpx.AsyncClient() as http:
            models = [m["id"] for m in (await http.get(f"{url}/v1/models")).json()["data"]]
        assert models == ["continuum-sim-8b"]
        # The README's "Try it" requests name the model the demo serves.
        readme = (Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
        assert set(re.findall(r'"model":"([^"]+)"', readme)) == set(models)
        assert f'"model":"{models[0]}"' in banner
        # What the banner says of its two requests: the second goes where the first went and
        # is served from that engine's cache.
        async with httpx.AsyncClient(timeout=30) as http:
            answers = [await http.post(f"{url}/v1/chat/completions", content=body) for body in bodies]
        assert [a.status_code for a in answers] == [200, 200]
        assert answers[1].headers["x-continuum-backend"] == answers[0].headers["x-continuum-backend"]
        assert answers[1].json()["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        system = {"role": "system", "content": "You are terse. " * 20}
        opening = [system, {"role": "user", "content": "Hello!"}]
        async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            first_raw = await client.chat.completions.with_raw_response.create(
                model=models[0], messages=opening, max_tokens=8
            )
            first = first_raw.parse()
            assert first.choices[0].message.content
            turn = [*opening, {"role": "assistant", "content": first.choices[0].message.content}]
            turn.append({"role": "user", "content": "And then?"})
            second_raw = await client.chat.completions.with_raw_response.create(
                model=models[0], messages=turn, max_tokens=8
            )
            second = second_raw.parse()
            # The banner's Responses snippet, and the same two turns over the Responses API.
            assert "client.responses.create(" in banner
            opened_raw = await client.responses.with_raw_response.create(
                model=models[0], instructions=system["content"], input="Good morning!", max_output_tokens=8
            )
            items = [
                {"role": "user", "content": "Good morning!"},
                {"role": "assistant", "content": [{"type": "output_text", "text": opened_raw.parse().output_text}]},
                {"role": "user", "content": "And then?"},
            ]
            answer_raw = await client.responses.with_raw_response.create(
                model=models[0],
                instructions=system["content"],
                input=items,
                max_output_tokens=8,  # type: ignore[arg-type]
            )
            answer = answer_raw.parse()
            # The banner's next line: a turn that continues the stored response by its id.
            assert "previous_response_id=answer.id" in banner
            later_raw = await client.responses.with_raw_response.create(
                model=models[0], input="One more?", previous_response_id=answer.id, max_output_tokens=8
            )
            later = later_raw.parse()
        # What the README says: the next turn goes to the engine that answered the first (it
        # holds the conversation's history), and that engine's prefix cache serves it.
        engine = first_raw.headers["x-continuum-backend"]
        assert engine.startswith("demo-")
        assert second_raw.headers["x-continuum-backend"] == engine
        assert second.usage is not None and second.usage.prompt_tokens_details is not None
        assert second.usage.prompt_tokens_details.cached_tokens > 0
        assert answer.output_text
        assert answer_raw.headers["x-continuum-backend"] == opened_raw.headers["x-continuum-backend"]
        assert answer.usage is not None and answer.usage.input_tokens_details.cached_tokens > 0
        assert later_raw.headers["x-continuum-backend"] == answer_raw.headers["x-continuum-backend"]
        assert later.usage is not None and later.usage.input_tokens_details.cached_tokens > 0
        # The demo wrote its config and started the embedded NATS with JetStream in .continuum/.
        assert (tmp_path / ".continuum" / "demo-config.yaml").exists()
        assert (tmp_path / ".continuum" / "nats" / "jetstream").is_dir()
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        async with asyncio.timeout(30):
            code = await proc.wait()
    assert code == 0
