"""A real `prometheus` (Debian's package; the test script installs it when missing) scraping
given targets every second, with its HTTP query API on a free port."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import yaml

from continuum_common.procs import ManagedProcess, find_binary


class PrometheusServer(ManagedProcess):
    name = "prometheus"

    def __init__(self, data_dir: Path, jobs: dict[str, list[str]]) -> None:
        super().__init__(data_dir)
        self.binary = find_binary("prometheus")
        self.jobs = jobs

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": [
                {"job_name": job, "static_configs": [{"targets": targets}]} for job, targets in self.jobs.items()
            ],
        }
        path = self.data_dir / "prometheus.yml"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump(config))
        return [
            self.binary,
            f"--config.file={path}",
            f"--storage.tsdb.path={self.data_dir / 'tsdb'}",
            f"--web.listen-address={self.host}:{self.port}",
        ]

    async def wait_ready(self) -> None:
        async with httpx.AsyncClient(timeout=1.0) as client:
            response = await client.get(f"{self.url}/-/ready")
        if response.status_code != 200:
            raise RuntimeError(f"prometheus not ready: {response.status_code}")

    async def query(self, expr: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=5.0) as client:
            response = await client.get(f"{self.url}/api/v1/query", params={"query": expr})
        body = response.json()
        if body.get("status") != "success":
            raise AssertionError(f"{expr!r}: {body.get('error')}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    async def targets(self) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(timeout=5.0) as client:
            body = (await client.get(f"{self.url}/api/v1/targets")).json()
        active: list[dict[str, Any]] = body["data"]["activeTargets"]
        return active
