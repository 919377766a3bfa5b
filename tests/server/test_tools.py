"""Tool calling through the openai client: tools, tool_choice (auto, required, a named function,
none), parallel_tool_calls, the calls in responses and streams, and conversations that carry calls
and their results back through the model's chat template (Qwen2.5's hermes format, Mistral's)."""
import json
import os

import jsonschema
import openai
import pytest
from tokenizers import Tokenizer

from serverlib import REPO, post

WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
           "required": ["city"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "now", "description": "The time"}}]
PARAMS = {"get_weather": WEATHER,
          "now": {"type": "object", "properties": {}, "additionalProperties": False}}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]


def short_json_bias(model):
    """logit_bias that makes the random-weight model write short JSON: no whitespace-only tokens
    (the grammar allows whitespace between tokens), quotes and closing brackets favoured."""
    tok = Tokenizer.from_file(os.path.join(REPO, "models", "test", model, "tokenizer.json"))
    bias = {str(i): -100 for i in range(tok.get_vocab_size())
            if tok.decode([i]) != "" and tok.decode([i]).strip() == ""}
    for piece in ('"', "}", "]", ","):
        if tok.token_to_id(piece) is not None:
            bias[str(tok.token_to_id(piece))] = 4
    return bias


@pytest.fixture(scope="module")
def qwen(start_server, chat_models):
    s = start_server("-m", chat_models["qwen2-tiny"], "--ctx", "2048", "-n", "32")
    yield s
    s.stop()


def client_of(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def streamed(client, **kwargs):
    """A streamed choice 0 put together: content, tool calls by index, finish reason."""
    content, calls, finish = "", {}, None
    for chunk in client.chat.completions.create(stream=True, **kwargs):
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for c in delta.tool_calls or []:
            call = calls.setdefault(c.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += c.id or ""
            call["name"] += c.function.name or ""
            call["arguments"] += c.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    return content, [calls[i] for i in sorted(calls)], finish


def check_calls(calls):
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), PARAMS[c.function.name])
        assert c.type == "function" and c.id.startswith("call_") and len(c.id) == 29


def test_required_and_named_calls(qwen):
    """tool_choice required: every finished reply is calls of the given tools whose arguments their
    schemas accept; a named function is called with valid arguments and finish_reason "stop";
    streaming gives the same calls, their arguments in pieces; parallel_tool_calls false gives one
    call."""
    client = client_of(qwen)
    bias = short_json_bias("qwen2-tiny")
    finished = 0
    for seed in range(4):
        kwargs = dict(model="x", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120,
                      temperature=1.0, seed=seed, logit_bias=bias)
        choice = client.chat.completions.create(**kwargs).choices[0]
        content, calls, finish = streamed(client, **kwargs)
        # Streamed or not, the same calls (cut by max_tokens, cut too: from the first whose name
        # is whole; before it the text is content).
        assert [(c["name"], c["arguments"]) for c in calls] == \
            [(c.function.name, c.function.arguments) for c in choice.message.tool_calls or []]
        assert finish == choice.finish_reason
        if choice.finish_reason == "length":
            assert (choice.message.tool_calls is None and choice.message.content.lstrip().startswith("[")) or \
                choice.message.content is None
            continue
        finished += 1
        assert choice.finish_reason == "tool_calls" and choice.message.content is None and content == ""
        check_calls(choice.message.tool_calls)
        # Each call's arguments come in pieces as they are generated (the first delta of a call
        # carries its id and name).
        pieces = [c for chunk in client.chat.completions.create(stream=True, **kwargs)
                  for c in chunk.choices[0].delta.tool_calls or []]
        assert len(pieces) > len(calls) and all(p.id for p in pieces if p.function.name)
        one = client.chat.completions.create(parallel_tool_calls=False, **kwargs).choices[0]
        assert one.finish_reason != "tool_calls" or len(one.message.tool_calls) == 1
    assert finished > 0

    named = dict(model="x", messages=MESSAGES, tools=TOOLS, max_tokens=120, temperature=1.0, seed=5,
                 logit_bias=bias, tool_choice={"type": "function", "function": {"name": "get_weather"}})
    choice = client.chat.completions.create(**named).choices[0]
    assert choice.finish_reason == "stop", choice
    [call] = choice.message.tool_calls
    assert call.function.name == "get_weather"
    check_calls([call])
    # Streamed, the arguments come in pieces as they are generated (as many as the stream's
    # reads find: the first carries the call's id and name, the others only arguments).
    content, calls, finish = streamed(client, **named)
    assert finish == "stop" and [(c["name"], c["arguments"]) for c in calls] == \
        [("get_weather", call.function.arguments)]
    pieces = [c for chunk in client.chat.completions.create(stream=True, **named)
              for c in chunk.choices[0].delta.tool_calls or []]
    assert pieces[0].id and all(p.id is None and p.function.name is None for p in pieces[1:])


def test_auto_and_none_leave_text_as_it_is(qwen):
    """A reply that writes no call is content under tool_choice auto, equal to tool_choice none's
    and to the streamed one."""
    client = client_of(qwen)
    kwargs = dict(model="x", messages=MESSAGES, tools=TOOLS, max_tokens=24, temperature=0)
    auto = client.chat.completions.create(**kwargs).choices[0]
    none = client.chat.completions.create(tool_choice="none", **kwargs).choices[0]
    assert "<tool_call>" not in auto.message.content
    assert auto.message.content == none.message.content and auto.message.tool_calls is None
    assert auto.finish_reason == none.finish_reason == "length"
    assert streamed(client, **kwargs) == (auto.message.content, [], "length")
    # The template shows the tools: the prompt is longer with them.
    plain = client.chat.completions.create(model="x", messages=MESSAGES, max_tokens=1)
    with_tools = client.chat.completions.create(model="x", messages=MESSAGES, tools=TOOLS, max_tokens=1)
    assert with_tools.usage.prompt_tokens > plain.usage.prompt_tokens + 50
    status, counted = post(qwen.url + "/tokenize", {"messages": MESSAGES, "tools": TOOLS})
    assert status == 200 and counted["count"] == with_tools.usage.prompt_tokens


@pytest.mark.parametrize("model", ["qwen2-tiny", "mistral-tiny"])
def test_a_call_and_its_result_go_back_to_the_model(start_server, chat_models, model):
    """The assistant's calls from a response and the tool's result, sent back in the next request,
    are rendered by the model's template (Mistral's requires 9-character call ids)."""
    s = start_server("-m", chat_models[model], "--ctx", "2048")
    try:
        client = client_of(s)
        bias = short_json_bias(model)
        reply = None
        for seed in range(6):
            choice = client.chat.completions.create(
                model="x", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=120,
                temperature=1.0, seed=seed, logit_bias=bias, parallel_tool_calls=False).choices[0]
            if choice.finish_reason == "tool_calls":
                reply = choice.message
                break
        assert reply is not None
        [call] = reply.tool_calls
        assert len(call.id) == (9 if model == "mistral-tiny" else 29)
        conversation = MESSAGES + [reply.model_dump(exclude_none=True),
                                   {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'}]
        after = client.chat.completions.create(model="x", messages=conversation, tools=TOOLS, max_tokens=4)
        assert after.choices[0].finish_reason in ("stop", "length", "tool_calls")
        status, counted = post(s.url + "/tokenize", {"messages": conversation, "tools": TOOLS})
        assert status == 200
        # The call's arguments are in the rendered conversation.
        status, text = post(s.url + "/detokenize", {"tokens": counted["tokens"]})
        assert json.loads(call.function.arguments).get("city", "") in text["prompt"]
        assert call.function.name in text["prompt"] and "temp" in text["prompt"]
    finally:
        s.stop()


def test_forced_calls_are_exact_under_quantspec(start_server, chat_models):
    """A call that tool_choice forces is generated under its schema's mask in every row, the
    draft's too: greedy QuantSpec writes AR INT8's call."""
    request = dict(model="x", messages=MESSAGES, tools=TOOLS, tool_choice="required", max_tokens=100,
                   temperature=0, logit_bias=short_json_bias("qwen2-tiny"))
    got = []
    for flags in (("--kv", "int8"), ("--mode", "quantspec", "--gamma", "4")):
        s = start_server("-m", chat_models["qwen2-tiny"], "--ctx", "1024", "--group-size", "32", *flags)
        try:
            got.append(client_of(s).chat.completions.create(**request).choices[0])
        finally:
            s.stop()
    ar8, spec = got
    assert (spec.message.content, spec.finish_reason) == (ar8.message.content, ar8.finish_reason)
    strip = lambda calls: [(c.function.name, c.function.arguments) for c in calls or []]
    assert strip(spec.message.tool_calls) == strip(ar8.message.tool_calls)
    assert ar8.finish_reason == "tool_calls", ar8  # a whole call (with the bias, in 100 tokens)
    check_calls(ar8.message.tool_calls)
