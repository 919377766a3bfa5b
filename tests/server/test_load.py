"""A bounded load test on loopback: 300 requests, 16 at a time, mixed streaming / non-streaming
completions and chat: zero 5xx, zero lost responses, stable memory, consistent metrics."""
import json
import random
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from serverlib import wait_until

N_REQUESTS = 300
CONCURRENCY = 16


def answered(metrics):
    return sum(v for k, v in metrics.items()
               if k.startswith('quantspec_http_requests_total{endpoint="/v1/'))


@pytest.fixture(scope="module")
def load_server(start_server, chat_models):
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "512", "-n", "16", "--max-queue", "64")
    yield s
    assert s.alive(), s.stderr


def one_request(base, i, session):
    rng = random.Random(i)
    chat = i % 2 == 0
    stream = i % 3 != 0
    payload = {"max_tokens": rng.randint(1, 24), "temperature": rng.choice([0, 0.7, 1.0]), "seed": i}
    if chat:
        payload["messages"] = [{"role": "user", "content": f"request {i}: " + "word " * rng.randint(0, 40)}]
        url = base + "/v1/chat/completions"
    else:
        payload["prompt"] = f"request {i}: " + "word " * rng.randint(0, 40)
        url = base + "/v1/completions"
    if stream:
        payload["stream"] = True
        payload["stream_options"] = {"include_usage": True}
    r = session.post(url, json=payload, stream=stream, timeout=120)
    if not stream:
        body = r.json()
        ok = r.status_code == 200 and body["choices"][0]["finish_reason"] in ("stop", "length")
        return r.status_code, ok, body.get("usage", {}).get("completion_tokens", 0)
    events = [line[6:] for line in r.iter_lines(decode_unicode=True) if line.startswith("data: ")]
    ok = r.status_code == 200 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    ok = ok and all("error" not in c for c in chunks)
    usage = [c for c in chunks if not c["choices"]]
    ok = ok and len(usage) == 1 and any(c["choices"] and c["choices"][0]["finish_reason"] for c in chunks)
    return r.status_code, ok, usage[0]["usage"]["completion_tokens"] if usage else 0


def run_load(server, n, offset):
    local = threading.local()

    def task(i):
        if not hasattr(local, "session"):
            local.session = requests.Session()
        try:
            return one_request(server.url, i, local.session)
        except Exception as e:  # noqa: BLE001 - a lost response
            return None, False, repr(e)

    with ThreadPoolExecutor(CONCURRENCY) as pool:
        return list(pool.map(task, range(offset, offset + n)))


def test_load(load_server):
    s = load_server
    warm = run_load(s, 40, 10000)
    assert all(r[1] for r in warm), [r for r in warm if not r[1]][:3]
    # The HTTP counter is bumped just after a response is sent: let it catch up.
    assert wait_until(lambda: answered(s.metrics()) == 40)
    rss_before = s.rss_kib()
    before = s.metrics()

    results = run_load(s, N_REQUESTS, 0)

    lost = [r for r in results if r[0] is None]
    server_errors = [r for r in results if r[0] is not None and r[0] >= 500]
    bad = [r for r in results if not r[1]]
    assert not lost, lost[:3]
    assert not server_errors, server_errors[:3]
    assert not bad, bad[:3]
    assert all(r[0] == 200 for r in results)

    assert wait_until(lambda: answered(s.metrics()) == 40 + N_REQUESTS)
    after = s.metrics()
    delta = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    assert sum(v for k, v in delta.items() if "status=\"5" in k) == 0
    finished = sum(v for k, v in delta.items() if k.startswith("quantspec_requests_finished_total"))
    assert finished == N_REQUESTS
    assert delta["quantspec_generation_tokens_total"] == sum(r[2] for r in results)
    assert delta["quantspec_time_to_first_token_seconds_count"] == N_REQUESTS
    assert after["quantspec_requests_waiting"] == 0 and after["quantspec_requests_running"] == 0

    # Stable memory: nothing per request is kept (allow allocator noise).
    growth_mib = (s.rss_kib() - rss_before) / 1024
    assert growth_mib < 24, f"RSS grew by {growth_mib:.1f} MiB over {N_REQUESTS} requests"
    assert s.get("/health")[0] == 200
