"""How long the webhook itself takes per request: HTTPS (kept alive), kopf's engine, the handler.

The API server adds its own work on top (tests/e2e/test_webhook_benchmark.py measures the whole
path); this isolates the operator's share. Run with `-s` to see the numbers.
"""

from __future__ import annotations

import asyncio
import copy
import json
import ssl
import time
from pathlib import Path

import aiohttp
import pytest

from asyncgrpo_api.v1alpha1 import AsyncGRPOJob
from asyncgrpo_operator import certs
from asyncgrpo_operator.webhook import WEBHOOK_PATH, WebhookConfig
from tests.webhook.jobs import job
from tests.webhook.server import admission_review, free_port, serving

pytestmark = pytest.mark.slow

N = 500


def test_webhook_answers_create_and_update_within_a_few_milliseconds(tmp_path: Path) -> None:
    files = certs.write_self_signed(["127.0.0.1"], tmp_path / "tls")
    config = WebhookConfig(addr="127.0.0.1", port=free_port(), cert_dir=files.directory)
    stored = AsyncGRPOJob.model_validate(job("bench")).to_manifest()  # defaults filled, as stored
    stored["status"] = {"phase": "Running"}
    updated = copy.deepcopy(stored)
    updated["spec"]["backoffLimit"] = 3
    reviews = {
        "create": admission_review("CREATE", stored),
        "update": admission_review("UPDATE", updated, stored),
    }

    async def scenario() -> dict[str, list[float]]:
        times: dict[str, list[float]] = {op: [] for op in reviews}
        context = ssl.create_default_context(cafile=str(files.ca))
        url = f"https://127.0.0.1:{config.port}{WEBHOOK_PATH}"
        async with serving(config), aiohttp.ClientSession() as session:
            for i in range(N + 50):
                for op, review in reviews.items():
                    start = time.perf_counter()
                    async with session.post(url, json=review, ssl=context) as resp:
                        body = await resp.json()
                    if i >= 50:
                        times[op].append((time.perf_counter() - start) * 1000)
                    assert body["response"]["allowed"] is True
        return times

    times = asyncio.run(scenario())
    result = {}
    for op, samples in times.items():
        samples.sort()
        result[op] = {
            "p50_ms": round(samples[len(samples) // 2], 2),
            "p99_ms": round(samples[int(len(samples) * 0.99)], 2),
        }
    print("WEBHOOK-SERVER " + json.dumps(result))
    assert result["update"]["p99_ms"] < 50, result
