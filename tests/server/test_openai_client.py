"""The official `openai` Python client against the server: completions and chat, streaming and not."""
import json
import os
import subprocess

import openai
import pytest
from tokenizers import Tokenizer

from serverlib import REPO, TEST_MODELS, post


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_models_list(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["llama3-tiny"]
    assert models.data[0].model_extra["max_model_len"] == 1024


def test_completion(client):
    r = client.completions.create(model="llama3-tiny", prompt="Hello", max_tokens=8, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.object == "text_completion" and r.model == "llama3-tiny" and r.id.startswith("cmpl-")
    c = r.choices[0]
    assert isinstance(c.text, str) and c.text
    assert c.finish_reason == "length"
    assert r.usage.completion_tokens == 8
    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    assert r.usage.prompt_tokens == len(tok.encode("Hello", add_special_tokens=True).ids)
    assert r.usage.total_tokens == r.usage.prompt_tokens + 8
    stats = r.model_extra["quantspec"]
    assert stats["mode"] == "ar"
    assert stats["speculative"] == {"drafted_tokens": 0, "accepted_tokens": 0, "acceptance_rate": None,
                                    "rounds": 0, "mean_accepted_length": None}
    assert stats["prefill_s"] >= 0 and stats["decode_s"] >= 0


def test_greedy_completion_matches_the_cli(client, quantspec_binary, chat_models):
    """The server runs the same generation as `quantspec generate` (prompt, params, detokenization)."""
    prompt, n = "The quick brown fox", 24
    cli = subprocess.run([quantspec_binary, "generate", "-m", chat_models["llama3-tiny"], "-p", prompt,
                          "-n", str(n), "--ignore-eos", "--ctx", "1024"],
                         capture_output=True, text=True, timeout=120, check=True)
    r = client.completions.create(model="x", prompt=prompt, max_tokens=n, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.choices[0].text == cli.stdout[:-1]  # the CLI ends its output with a newline


def test_completion_streaming_equals_non_streaming(client):
    kwargs = dict(model="llama3-tiny", prompt="Once upon a time", max_tokens=20, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.completions.create(**kwargs).choices[0].text
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == "length"
    assert finals[0].model_extra["quantspec"]["speculative"]["drafted_tokens"] == 0
    usage = [c for c in chunks if not c.choices]
    assert len(usage) == 1 and usage[0].usage.completion_tokens == 20
    assert len({c.id for c in chunks}) == 1


def test_chat(client):
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}]
    r = client.chat.completions.create(model="llama3-tiny", messages=messages, max_tokens=6,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and r.id.startswith("chatcmpl-")
    assert r.choices[0].message.role == "assistant"
    assert isinstance(r.choices[0].message.content, str)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6


def test_chat_streaming_equals_non_streaming(client):
    kwargs = dict(model="llama3-tiny", messages=[{"role": "user", "content": "Tell me a story"}],
                  max_tokens=16, temperature=0, extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == whole
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_stop_strings(client):
    kwargs = dict(model="llama3-tiny", prompt="Hello world", max_tokens=32, temperature=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    assert len(full) > 12
    stop = full[8:11]
    expected = full[:full.index(stop)]
    for stop_arg in (stop, [stop], ["never-appears-xyz", stop]):
        r = client.completions.create(stop=stop_arg, **kwargs)
        assert r.choices[0].text == expected
        assert r.choices[0].finish_reason == "stop"
    streamed = "".join(c.choices[0].text for c in client.completions.create(stream=True, stop=stop, **kwargs))
    assert streamed == expected


def test_seed_makes_sampling_reproducible(client):
    kwargs = dict(model="llama3-tiny", prompt="Once upon", max_tokens=24, temperature=0.9, top_p=0.95,
                  extra_body={"ignore_eos": True})
    a = client.completions.create(seed=7, **kwargs).choices[0].text
    b = client.completions.create(seed=7, **kwargs).choices[0].text
    c = client.completions.create(seed=8, **kwargs).choices[0].text
    assert a == b
    assert a != c


def test_default_max_tokens_is_the_servers(client):
    r = client.completions.create(model="x", prompt="Hi", temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 32  # started with -n 32


def test_token_id_prompts(server):
    for prompt in ([2041, 100, 200], [[2041, 100, 200]]):
        status, body = post(server.url + "/v1/completions",
                            {"prompt": prompt, "max_tokens": 4, "temperature": 0})
        assert status == 200, body
        assert body["usage"]["prompt_tokens"] == 3


def test_client_gets_n_choices(client):
    """n > 1: the choices one after another (seeds seed, seed + 1, ...), plain and streamed."""
    r = client.completions.create(model="x", prompt="Once upon a time", n=3, max_tokens=6,
                                  temperature=1.0, seed=4)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert r.usage.completion_tokens == 18  # the prompt counted once
    texts = [c.text for c in r.choices]
    streamed = ["", "", ""]
    finished = [None, None, None]
    for chunk in client.completions.create(model="x", prompt="Once upon a time", n=3, max_tokens=6,
                                           temperature=1.0, seed=4, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
            finished[c.index] = c.finish_reason or finished[c.index]
    assert streamed == texts and finished == ["length"] * 3
    chat = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}],
                                          n=2, max_tokens=4, temperature=1.0, seed=4)
    assert [c.index for c in chat.choices] == [0, 1]
    assert all(c.message.role == "assistant" for c in chat.choices)


def test_client_sends_a_batch_of_prompts(client):
    """A list of prompts (texts or token ids) runs one after another: choice p * n + i is prompt
    p's i-th, each equal to that prompt sent alone; usage counts each prompt once."""
    prompts = ["Once upon a time", "The quick brown fox", "Hello"]
    alone = [client.completions.create(model="x", prompt=p, max_tokens=5, temperature=1.0, seed=9,
                                       n=2) for p in prompts]
    r = client.completions.create(model="x", prompt=prompts, max_tokens=5, temperature=1.0, seed=9,
                                  n=2)
    assert [c.index for c in r.choices] == list(range(6))
    assert [c.text for c in r.choices] == [c.text for a in alone for c in a.choices]
    assert r.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    assert r.usage.completion_tokens == 30
    streamed = [""] * 6
    for chunk in client.completions.create(model="x", prompt=prompts, max_tokens=5, temperature=1.0,
                                           seed=9, n=2, stream=True):
        for c in chunk.choices:
            streamed[c.index] += c.text
    assert streamed == [c.text for c in r.choices]
    # Token ids, with echo: each choice starts with its own prompt's text.
    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    ids = [tok.encode(p, add_special_tokens=True).ids for p in prompts[:2]]
    e = client.completions.create(model="x", prompt=ids, max_tokens=3, temperature=0, echo=True,
                                  logprobs=1)
    for c, p, i in zip(e.choices, prompts[:2], ids):
        assert c.text.startswith(p)
        assert len(c.logprobs.tokens) == len(i) + 3 and c.logprobs.token_logprobs[0] is None


def test_client_sees_openai_errors(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="x", prompt="Hi", best_of=2)
    assert e.value.code == "unsupported_parameter" and e.value.param == "best_of"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="x", messages=[{"role": "user", "content": "x"}], temperature=-1)
    assert e.value.param == "temperature"


def render_with_hf(template, messages, bos, eos):
    """Render as transformers' apply_chat_template does: jinja2 sandbox, trim_blocks,
    lstrip_blocks, loop controls, raise_exception; tools and documents are None."""
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=True, bos_token=bos, eos_token=eos)


def token_text(tok):
    return tok if isinstance(tok, str) else tok["content"]


@pytest.mark.parametrize("name", TEST_MODELS)
def test_chat_prompt_is_the_models_template_as_hf_renders_it(start_server, chat_models, name):
    """Every test model, with its fixture template: the prompt the server builds has exactly the
    tokens of HF's rendering of the same conversation."""
    s = start_server("-m", chat_models[name], "--ctx", "512")
    try:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
        status, body = post(s.url + "/v1/chat/completions",
                            {"messages": messages, "max_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert status == 200, body
        cfg = json.load(open(os.path.join(chat_models[name], "tokenizer_config.json")))
        text = render_with_hf(cfg["chat_template"], messages, token_text(cfg["bos_token"]),
                              token_text(cfg["eos_token"]))
        tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", name, "tokenizer.json"))
        assert body["usage"]["prompt_tokens"] == len(tok.encode(text, add_special_tokens=False).ids)
        assert "chat template:" in s.stderr and "tokenizer_config.json" in s.stderr
    finally:
        s.stop()


def test_quantspec_mode_reports_speculative_statistics(start_server, chat_models, quantspec_binary):
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "1024", "--mode", "quantspec")
    try:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0)
        before = s.metrics()
        kwargs = dict(model="x", prompt="The quick brown fox", max_tokens=200, temperature=0,
                      extra_body={"ignore_eos": True})
        r = client.completions.create(**kwargs)
        stats = r.model_extra["quantspec"]
        spec = stats["speculative"]
        assert stats["mode"] == "quantspec"
        assert spec["drafted_tokens"] > 0 and spec["rounds"] > 0
        assert 0 <= spec["accepted_tokens"] <= spec["drafted_tokens"]
        assert spec["acceptance_rate"] == pytest.approx(spec["accepted_tokens"] / spec["drafted_tokens"])
        assert spec["mean_accepted_length"] == pytest.approx(1 + spec["accepted_tokens"] / spec["rounds"])
        after = s.metrics()
        for key, field in (("draft", "drafted_tokens"), ("accepted", "accepted_tokens"), ("rounds", "rounds")):
            name = f"quantspec_spec_decode_{key}_tokens_total" if key != "rounds" else "quantspec_spec_decode_rounds_total"
            assert after[name] - before.get(name, 0) == spec[field]
        # The same engine as `quantspec generate --mode quantspec`.
        cli = subprocess.run([quantspec_binary, "generate", "-m", chat_models["llama3-tiny"], "--ctx", "1024",
                              "--mode", "quantspec", "-p", "The quick brown fox", "-n", "200", "--ignore-eos"],
                             capture_output=True, text=True, timeout=120, check=True)
        assert r.choices[0].text == cli.stdout[:-1]
        final = [c for c in client.completions.create(stream=True, **kwargs) if c.choices[0].finish_reason]
        assert final[0].model_extra["quantspec"]["speculative"] == spec
    finally:
        s.stop()


@pytest.mark.parametrize("mode", ["ar-int8", "quantspec"])
def test_prompt_cache_keeps_a_long_prompt_for_the_next_choice(start_server, chat_models, mode):
    """The same prompt again (another choice of the request, a retry): under a quantized cache
    the whole prompt is kept, also where the previous completion crossed quantization groups (the
    cache keeps those full-precision rows for it, and the prompt's logits), and the completion is
    a server's without the cache. usage reports each prompt's first choice."""
    mode_args = ["--mode", "ar", "--kv", "int8"] if mode == "ar-int8" else ["--mode", mode]
    common = ["-m", chat_models["llama3-tiny"], "--ctx", "1024", "--group-size", "32", *mode_args]
    cached = start_server(*common)
    fresh = start_server(*common, "--prompt-cache", "off")
    try:
        prompt = list(range(100, 400))
        body = {"prompt": prompt, "max_tokens": 100, "temperature": 0, "ignore_eos": True}
        status, want = post(fresh.url + "/v1/completions", body)
        assert status == 200, want
        status, got = post(cached.url + "/v1/completions", {**body, "n": 2})
        assert status == 200, got
        assert got["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        assert [c["text"] for c in got["choices"]] == [want["choices"][0]["text"]] * 2
        status, again = post(cached.url + "/v1/completions", body)
        assert status == 200, again
        assert again["usage"]["prompt_tokens_details"] == {"cached_tokens": len(prompt)}
        assert again["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        cached.stop()
        fresh.stop()


@pytest.mark.parametrize("mode", ["ar", "quantspec"])
def test_prompt_cache_keeps_the_previous_requests_tokens(start_server, chat_models, mode):
    """--prompt-cache (on by default): a prompt that starts with the previous request's prompt
    prefills only the rest, reports the kept tokens (usage.prompt_tokens_details.cached_tokens and
    quantspec_prompt_tokens_cached_total), and completes as a server without the cache does (the
    kept history is shorter than a key group here, so also the quantized cache continues exactly)."""
    common = ["-m", chat_models["llama3-tiny"], "--ctx", "1024", "--mode", mode]
    cached = start_server(*common)
    fresh = start_server(*common, "--prompt-cache", "off")
    assert "prompt cache: on" in cached.stderr and "prompt cache: off" in fresh.stderr
    try:
        first = list(range(100, 140))
        second = first + list(range(300, 330))
        body = {"max_tokens": 12, "temperature": 0, "ignore_eos": True}
        status, r1 = post(cached.url + "/v1/completions", {"prompt": first, **body})
        assert status == 200, r1
        assert r1["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        status, r2 = post(cached.url + "/v1/completions", {"prompt": second, **body})
        assert status == 200, r2
        # The cache held the first prompt and 11 of its 12 completion tokens.
        assert 40 <= r2["usage"]["prompt_tokens_details"]["cached_tokens"] <= 51
        assert r2["usage"]["prompt_tokens"] == 70
        assert cached.metrics()["quantspec_prompt_tokens_cached_total"] == \
            r2["usage"]["prompt_tokens_details"]["cached_tokens"]
        for prompt, got in ((first, r1), (second, r2)):
            status, want = post(fresh.url + "/v1/completions", {"prompt": prompt, **body})
            assert status == 200, want
            assert want["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
            assert got["choices"][0]["text"] == want["choices"][0]["text"]
    finally:
        cached.stop()
        fresh.stop()


def ar_int8_and_quantspec(start_server, chat_models, request):
    """The first choice of `request` (a chat) on an AR INT8 server and on a QuantSpec server."""
    ar8 = start_server("-m", chat_models["llama3-tiny"], "--ctx", "1024", "--kv", "int8", "--group-size", "32")
    spec = start_server("-m", chat_models["llama3-tiny"], "--ctx", "1024", "--mode", "quantspec",
                        "--group-size", "32", "--gamma", "4")
    try:
        got = []
        for s in (ar8, spec):
            c = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=60)
            got.append(c.chat.completions.create(**request).choices[0])
        return got
    finally:
        ar8.stop()
        spec.stop()


def test_chat_json_schema(client, start_server, chat_models):
    """response_format json_schema, as the openai client's parse() sends it from a pydantic model: a
    finished message is a document the schema accepts (jsonschema's check and pydantic's), its
    properties in the schema's order (a tuple's items in theirs); streamed equals not streamed;
    QuantSpec's greedy message is AR INT8's."""
    import jsonschema
    from decimal import Decimal
    from typing import Annotated, Literal, Optional

    from pydantic import BaseModel, Field

    class Box(BaseModel):  # properties out of alphabetical order, as users write them
        size: Literal["small", "large"]
        name: Annotated[str, Field(max_length=8)]
        tags: Annotated[list[Annotated[str, Field(max_length=6)]], Field(max_length=2)]
        weight: Optional[int]
        count: Annotated[int, Field(ge=1, lt=13)]  # minimum / exclusiveMaximum
        price: Annotated[float, Field(gt=0, le=9.5)]  # a number's exclusiveMinimum / maximum
        code: Annotated[str, Field(pattern=r"^[A-Z]{2}-\d{2}$")]
        corner: tuple[int, Literal["cm", "in"]]  # prefixItems
        cost: Decimal  # a number or a string of pydantic's pattern, which starts with a lookahead
        step: Annotated[int, Field(multiple_of=5)]  # multipleOf
        share: Annotated[float, Field(multiple_of=0.25, ge=0, le=4)]  # ... beside bounds
        colors: set[Literal["red", "green", "blue"]]  # uniqueItems
        ids: set[int]  # ... of integers
        marks: dict[Literal["x", "y"], bool]  # propertyNames
        extra: Annotated[dict[str, int], Field(min_length=1, max_length=2)]  # min/maxProperties

    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    bias = {str(tok.token_to_id(p)): 4 for p in ('"', "}", ",", "]")}
    messages = [{"role": "user", "content": "Describe a box in JSON."}]
    finished = 0
    for seed in range(1, 7):
        try:
            r = client.chat.completions.parse(model="x", messages=messages, max_tokens=400, temperature=1.0,
                                              seed=seed, logit_bias=bias, response_format=Box)
        except openai.LengthFinishReasonError:
            continue  # a prefix of one: the client refuses to parse it
        content = r.choices[0].message.content
        assert isinstance(r.choices[0].message.parsed, Box), content
        doc = json.loads(content)
        jsonschema.validate(doc, Box.model_json_schema())
        assert [k for k in ("size", "name", "tags", "weight", "count", "price", "code", "corner",
                                          "cost", "step", "share", "colors", "ids", "marks", "extra") if k in doc] == \
            list(doc), content
        finished += 1
    assert finished > 0

    schema = {"type": "object", "properties": {"b": {"enum": ["x", "yz"]}, "a": {"type": "integer"}},
              "required": ["b", "a"], "additionalProperties": False}
    bias[str(tok.token_to_id(":"))] = 4
    kwargs = dict(model="x", messages=messages, max_tokens=150, temperature=0.8, seed=3, logit_bias=bias,
                  response_format={"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}})
    choice = client.chat.completions.create(**kwargs).choices[0]
    content = choice.message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert choice.finish_reason == "stop", content  # an enum and an integer: short with the bias
    doc = json.loads(content)
    jsonschema.validate(doc, schema)
    assert list(doc) == ["b", "a"], content

    ar8, spec = ar_int8_and_quantspec(start_server, chat_models, dict(kwargs, temperature=0))
    assert spec.message.content == ar8.message.content
    if ar8.finish_reason == "stop":
        jsonschema.validate(json.loads(ar8.message.content), schema)


def test_chat_json_schema_formats(client):
    """The string formats pydantic's types write into a schema (date-time, date, time, duration,
    uuid, ipv4, ipv6, email, uri) are followed: every finished choice, sampled from a random model
    at temperature 1, validates as the pydantic model (its own parsers for each type) and against
    the schema with jsonschema's format checks."""
    import jsonschema
    from datetime import date, datetime, time, timedelta
    from ipaddress import IPv4Address, IPv6Address
    from uuid import UUID

    from pydantic import AnyUrl, BaseModel, EmailStr

    class Record(BaseModel):
        when: datetime
        day: date
        at: time
        took: timedelta
        id: UUID
        v4: IPv4Address
        v6: IPv6Address
        mail: EmailStr
        site: AnyUrl

    schema = Record.model_json_schema()
    assert {p["format"] for p in schema["properties"].values()} == {
        "date-time", "date", "time", "duration", "uuid", "ipv4", "ipv6", "email", "uri"}
    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    bias = {str(tok.token_to_id(p)): 3 for p in ("}", ",")}
    bias[str(tok.token_to_id('"'))] = 8  # strings end where they may (a path could go on and on)
    # A URL's scheme and an email's local part end only at these.
    bias.update({str(tok.token_to_id(p)): 5 for p in (":", "@")})
    # No whitespace between the values (a random model pads with all it may).
    spaces = [i for i in range(tok.get_vocab_size()) if tok.decode([i]) and not tok.decode([i]).strip()]
    assert 0 < len(spaces) < 290
    bias.update({str(i): -100 for i in spaces})
    messages = [{"role": "user", "content": "A record in JSON."}]
    finished = 0
    for seed in (1, 9):
        r = client.chat.completions.create(
            model="x", messages=messages, max_tokens=600, temperature=1.0, seed=seed, n=8, logit_bias=bias,
            response_format={"type": "json_schema", "json_schema": {"name": "record", "schema": schema}})
        for choice in r.choices:
            if choice.finish_reason != "stop":
                continue  # cut by max_tokens: a prefix of one
            content = choice.message.content
            Record.model_validate_json(content)
            jsonschema.validate(json.loads(content), schema, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER)
            finished += 1
    assert finished >= 12


def test_completions_response_format(server):
    """response_format on /v1/completions (as vLLM takes it): the text is a document the schema
    accepts once it finished, the same streamed; a bad schema is a 400 naming it."""
    import jsonschema

    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    bias = {str(tok.token_to_id(p)): 4 for p in ('"', "}", ",", ":")}
    schema = {"type": "object", "properties": {"b": {"enum": ["x", "yz"]}, "a": {"type": "integer"}},
              "required": ["b", "a"], "additionalProperties": False}
    body = {"prompt": "A JSON object:", "max_tokens": 150, "temperature": 0.8, "seed": 3, "logit_bias": bias,
            "response_format": {"type": "json_schema", "json_schema": {"name": "ab", "schema": schema}}}
    status, r = post(server.url + "/v1/completions", body)
    assert status == 200, r
    text, finish = r["choices"][0]["text"], r["choices"][0]["finish_reason"]
    assert finish == "stop", text
    jsonschema.validate(json.loads(text), schema)
    c = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)
    chunks = c.completions.create(model="x", stream=True, extra_body={"response_format": body["response_format"]},
                                  **{k: v for k, v in body.items() if k != "response_format"})
    assert "".join(ch.choices[0].text for ch in chunks) == text
    status, r = post(server.url + "/v1/completions", dict(body, response_format={"type": "json_schema",
                     "json_schema": {"name": "x", "schema": {"type": "object", "patternProperties": {"^a": {}}}}}))
    assert status == 400 and r["error"]["param"] == "response_format.json_schema.schema", r


def test_chat_json_mode(client, start_server, chat_models):
    """response_format json_object: the message is a prefix of one JSON object (the whole object when
    it finished with "stop"), the same streamed, and QuantSpec's greedy message is AR INT8's."""
    bias = {}
    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", "llama3-tiny", "tokenizer.json"))
    for piece in ('"', "}", ":"):  # favoured, so that the random-weight model closes some objects
        bias[str(tok.token_to_id(piece))] = 4
    finished = 0
    for seed in range(1, 7):
        kwargs = dict(model="x", messages=[{"role": "user", "content": "Answer in JSON."}],
                      max_tokens=48, temperature=1.0, seed=seed, logit_bias=bias,
                      response_format={"type": "json_object"})
        r = client.chat.completions.create(**kwargs)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert content.lstrip(" \t\r\n").startswith("{"), content
        if finish == "stop":
            assert isinstance(json.loads(content), dict), content
            finished += 1
        else:
            assert finish == "length" and r.usage.completion_tokens == 48
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        assert "".join(c.choices[0].delta.content or "" for c in chunks) == content
    assert finished > 0

    greedy = dict(model="x", messages=[{"role": "user", "content": "List three colors as JSON."}],
                  max_tokens=40, temperature=0, response_format={"type": "json_object"})
    want = client.chat.completions.create(**greedy).choices[0].message.content
    ar8, spec = ar_int8_and_quantspec(start_server, chat_models, greedy)
    assert spec.message.content == ar8.message.content
    assert ar8.message.content.lstrip(" \t\r\n").startswith("{") and want.lstrip(" \t\r\n").startswith("{")
