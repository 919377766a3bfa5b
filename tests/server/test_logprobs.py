"""Log-probabilities in the OpenAI formats (completions' legacy object, chat's content list), plain
and streamed, on the bundled model; QuantSpec reports the target's values, the ones AR decoding
over the same INT8 view reports."""
import json
import math
import urllib.request

import pytest

from serverlib import REPO, post

C = "/v1/completions"
CH = "/v1/chat/completions"
PROMPT = "The Lord said unto Moses,"


def stream_events(url, payload):
    req = urllib.request.Request(url, data=json.dumps({**payload, "stream": True}).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    events = []
    with urllib.request.urlopen(req, timeout=60) as r:
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data: ") and line != "data: [DONE]":
                events.append(json.loads(line[6:]))
    return events


@pytest.fixture(scope="module")
def servers(start_server):
    model = f"{REPO}/models/default"
    spec = start_server("-m", model, "--ctx", "1024", "--mode", "quantspec", "--gamma", "3")
    ar = start_server("-m", model, "--ctx", "1024", "--kv", "int8")
    yield spec, ar
    spec.stop()
    ar.stop()


def check_completion_logprobs(lp, n_tokens, top):
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == n_tokens
    offset = 0
    for tok, value, alts, off in zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                     lp["text_offset"]):
        assert value <= 0
        assert off == offset
        offset += len(tok)
        # the alternatives and the chosen token itself
        assert alts[tok] == value and top <= len(alts) <= top + 1
        assert all(v <= 0 for v in alts.values())
        assert math.fsum(math.exp(v) for v in alts.values()) <= 1 + 1e-5


def test_completions_logprobs_plain_and_streamed(servers):
    spec, _ = servers
    req = {"prompt": PROMPT, "max_tokens": 24, "temperature": 0, "logprobs": 3, "ignore_eos": True}
    status, body = post(spec.url + C, req)
    assert status == 200, body
    choice = body["choices"][0]
    lp = choice["logprobs"]
    check_completion_logprobs(lp, body["usage"]["completion_tokens"], 3)
    assert "".join(lp["tokens"]) == choice["text"]
    for value, alts in zip(lp["token_logprobs"], lp["top_logprobs"]):
        assert value == max(alts.values())  # greedy: the most likely token
    assert body["quantspec"]["speculative"]["rounds"] > 0

    events = stream_events(spec.url + C, req)
    tokens, values, offsets, text = [], [], [], ""
    for e in events:
        c = e["choices"][0]
        text += c["text"]
        if c["logprobs"] is not None:
            tokens += c["logprobs"]["tokens"]
            values += c["logprobs"]["token_logprobs"]
            offsets += c["logprobs"]["text_offset"]
    assert text == choice["text"]
    assert tokens == lp["tokens"] and offsets == lp["text_offset"]
    # The second request's prompt comes from the prompt cache (its last token prefilled alone):
    # the same tokens, logits equal to rounding.
    assert values == pytest.approx(lp["token_logprobs"], abs=1e-4)

    # Not asked: null, as before.
    status, body = post(spec.url + C, {"prompt": PROMPT, "max_tokens": 4})
    assert status == 200 and body["choices"][0]["logprobs"] is None


def test_chat_logprobs_plain_and_streamed(servers):
    spec, _ = servers
    req = {"messages": [{"role": "user", "content": "Who led the people out of Egypt?"}],
           "max_tokens": 16, "temperature": 0.7, "seed": 5, "logprobs": True, "top_logprobs": 2}
    status, body = post(spec.url + CH, req)
    assert status == 200, body
    choice = body["choices"][0]
    content = choice["logprobs"]["content"]
    assert choice["logprobs"]["refusal"] is None
    assert len(content) == body["usage"]["completion_tokens"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["logprob"] <= 0
        assert bytes(entry["bytes"]).decode("utf-8") == entry["token"]
        alts = entry["top_logprobs"]
        assert len(alts) == 2 and alts[0]["logprob"] >= alts[1]["logprob"] >= -math.inf
        assert alts[0]["logprob"] >= entry["logprob"]  # sampled: not always the most likely

    events = stream_events(spec.url + CH, req)  # the same seed: the same tokens
    streamed = [x for e in events if e["choices"] and e["choices"][0]["logprobs"]
                for x in e["choices"][0]["logprobs"]["content"]]
    assert [x["token"] for x in streamed] == [x["token"] for x in content]
    assert [x["logprob"] for x in streamed] == pytest.approx([x["logprob"] for x in content], abs=1e-4)

    status, body = post(spec.url + CH, {**req, "logprobs": False, "top_logprobs": 0})
    assert status == 200 and body["choices"][0]["logprobs"] is None


def test_quantspec_reports_the_ar_int8_values(servers):
    """Greedy QuantSpec emits AR INT8's tokens; each one's log-probability is the target's, so the
    two servers agree on every value (accepted candidates and corrections alike)."""
    spec, ar = servers
    req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "logprobs": 2, "ignore_eos": True}
    s_status, s_body = post(spec.url + C, req)
    a_status, a_body = post(ar.url + C, req)
    assert s_status == 200 and a_status == 200
    s_lp, a_lp = s_body["choices"][0]["logprobs"], a_body["choices"][0]["logprobs"]
    assert s_lp["tokens"] == a_lp["tokens"]
    assert s_lp["token_logprobs"] == pytest.approx(a_lp["token_logprobs"], abs=1e-4)
    spec_stats = s_body["quantspec"]["speculative"]
    assert 0 < spec_stats["accepted_tokens"] <= spec_stats["drafted_tokens"]


def test_penalties_and_logit_bias(servers):
    """presence / frequency penalties and logit_bias: QuantSpec adjusts the draft's and the
    target's rows alike, so greedy output equals AR INT8's with the same adjustment."""
    spec, ar = servers
    req = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True,
           "frequency_penalty": 1.2, "presence_penalty": 0.3}
    s_status, s_body = post(spec.url + C, req)
    a_status, a_body = post(ar.url + C, req)
    assert s_status == 200 and a_status == 200, (s_body, a_body)
    assert s_body["choices"][0]["text"] == a_body["choices"][0]["text"]
    _, plain = post(ar.url + C, {k: v for k, v in req.items() if not k.endswith("penalty")})
    assert plain["choices"][0]["text"] != a_body["choices"][0]["text"]

    status, tok = post(spec.url + "/tokenize", {"prompt": " Moses", "add_special_tokens": False})
    assert status == 200
    moses = tok["tokens"][0]
    status, body = post(spec.url + C, {"prompt": PROMPT, "max_tokens": 6, "temperature": 0.8,
                                        "logit_bias": {str(moses): 100}, "logprobs": 0})
    assert status == 200, body
    tokens = body["choices"][0]["logprobs"]["tokens"]  # a bias of 100 decides every token
    assert len(tokens) == 6 and len(set(tokens)) == 1 and "Moses" in tokens[0], tokens
    assert body["choices"][0]["text"] == tokens[0] * 6


def test_n_choices_with_logprobs(servers):
    """n choices run one after another (seeds seed, seed + 1); each has its own logprobs, plain
    and streamed (text_offset restarting at 0 for each choice), and usage counts the prompt once."""
    spec, _ = servers
    req = {"prompt": PROMPT, "max_tokens": 8, "temperature": 1.0, "seed": 9, "n": 2, "logprobs": 1,
           "ignore_eos": True}
    status, body = post(spec.url + C, req)
    assert status == 200, body
    choices = body["choices"]
    assert [c["index"] for c in choices] == [0, 1]
    for c in choices:
        check_completion_logprobs(c["logprobs"], 8, 1)
    assert body["usage"]["completion_tokens"] == 16
    one = post(spec.url + C, {**req, "n": 1})[1]["choices"][0]  # choice 0 = the same seed alone
    assert one["text"] == choices[0]["text"]

    per_index = {0: [], 1: []}
    finish = {}
    for e in stream_events(spec.url + C, req):
        for c in e["choices"]:
            if c["logprobs"]:
                per_index[c["index"]] += c["logprobs"]["tokens"]
                assert c["logprobs"]["text_offset"][0] == sum(len(t) for t in per_index[c["index"]][
                    :len(per_index[c["index"]]) - len(c["logprobs"]["tokens"])])
            if c["finish_reason"]:
                finish[c["index"]] = c["finish_reason"]
    assert [per_index[i] for i in (0, 1)] == [c["logprobs"]["tokens"] for c in choices]
    assert finish == {0: "length", 1: "length"}


def tokenize(server, prompt):
    status, body = post(server.url + "/tokenize", {"prompt": prompt})
    assert status == 200, body
    return body["tokens"]


def test_echo_scores_the_prompt(servers):
    """`echo` (what lm-evaluation-harness's completions backend sends to score a text): the
    choice's text starts with the prompt, and with logprobs every prompt token but the first gets
    its value under the target; QuantSpec's values are AR INT8's (one target, one view)."""
    spec, ar = servers
    n_prompt = len(tokenize(ar, PROMPT))
    values = []
    for server in (spec, ar):
        status, body = post(server.url + C, {"prompt": PROMPT, "max_tokens": 0, "echo": True,
                                             "logprobs": 2})
        assert status == 200, body
        choice = body["choices"][0]
        assert choice["text"] == PROMPT
        assert body["usage"]["completion_tokens"] == 0
        lp = choice["logprobs"]
        assert len(lp["tokens"]) == n_prompt
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        # The BOS the tokenizer added is not in the echoed text: it is 0 characters wide, and
        # every offset points into the text.
        assert lp["text_offset"][:2] == [0, 0]
        check_completion_logprobs({k: v[1:] for k, v in lp.items()}, n_prompt - 1, 2)
        values.append(lp["token_logprobs"][1:])
    assert values[0] == pytest.approx(values[1], abs=1e-4)

    # With a completion: the prompt, then the same text and values as without echo.
    req = {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "logprobs": 1, "ignore_eos": True}
    status, plain = post(ar.url + C, req)
    assert status == 200, plain
    status, echoed = post(ar.url + C, {**req, "echo": True})
    assert status == 200, echoed
    got, want = echoed["choices"][0], plain["choices"][0]
    assert got["text"] == PROMPT + want["text"]
    assert got["logprobs"]["tokens"][n_prompt:] == want["logprobs"]["tokens"]
    assert got["logprobs"]["token_logprobs"][n_prompt:] == pytest.approx(
        want["logprobs"]["token_logprobs"], abs=1e-5)
    assert got["logprobs"]["token_logprobs"][1:n_prompt] == pytest.approx(values[1], abs=1e-5)
    offsets = got["logprobs"]["text_offset"]
    assert offsets[n_prompt:] == [len(PROMPT) + o for o in want["logprobs"]["text_offset"]]
    for tok, off in zip(got["logprobs"]["tokens"][1:], offsets[1:]):
        assert got["text"][off:off + len(tok)] == tok

    # Streamed: the first chunk carries the prompt and its values.
    events = stream_events(ar.url + C, {**req, "echo": True})
    first = events[0]["choices"][0]
    assert first["text"] == PROMPT
    assert first["logprobs"]["token_logprobs"][0] is None
    assert len(first["logprobs"]["tokens"]) == n_prompt
    assert first["logprobs"]["text_offset"] == offsets[:n_prompt]
    assert "".join(e["choices"][0]["text"] for e in events if e["choices"]) == got["text"]

    # Without echo, max_tokens 0 asks for nothing.
    status, body = post(ar.url + C, {"prompt": PROMPT, "max_tokens": 0})
    assert status == 400 and body["error"]["param"] == "max_tokens", body


def test_echo_as_lm_eval_sends_it(servers):
    """lm-evaluation-harness's local-completions loglikelihood request (tokenized, batch 1): the
    continuation's values are token_logprobs[ctxlen:-1], greedy where each is the top entry."""
    _, ar = servers
    ids = tokenize(ar, PROMPT + " and Aaron")
    ctxlen = len(tokenize(ar, PROMPT))
    status, body = post(ar.url + C, {"model": "m", "prompt": [ids], "temperature": 0,
                                     "max_tokens": 1, "logprobs": 1, "seed": 1234, "echo": True})
    assert status == 200, body
    lp = body["choices"][0]["logprobs"]
    assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then the one generated token
    cont = lp["token_logprobs"][ctxlen:-1]
    assert len(cont) == len(ids) - ctxlen and all(v <= 0 for v in cont)
    for tok, top in zip(lp["tokens"][ctxlen:-1], lp["top_logprobs"][ctxlen:-1]):
        assert tok in top  # is_greedy compares it with max(top, key=top.get)
