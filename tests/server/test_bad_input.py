"""Bad input of every kind gets a 4xx with an OpenAI-style error body, and the server lives on."""
import json
import socket
import threading
import time

import pytest

from serverlib import post, wait_until

C = "/v1/completions"
CH = "/v1/chat/completions"
USER = [{"role": "user", "content": "Hi"}]

# (endpoint, payload or raw bytes, status, param, code); param/code None: not checked.
MATRIX = [
    # malformed bodies
    (C, b"{bad", 400, None, "invalid_json"),
    (C, b"", 400, None, "invalid_json"),
    (C, b"[1, 2]", 400, None, None),
    (C, b"null", 400, None, None),
    (C, b'"prompt"', 400, None, None),
    (C, b'{"prompt": "\xff\xfe"}', 400, None, "invalid_json"),
    (C, b'{"prompt": "\\ud800"}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "temperature": NaN}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "temperature": Infinity}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x",}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x"} trailing', 400, None, "invalid_json"),
    (C, b'{"prompt": ' + b"[" * 100000 + b"]" * 100000 + b"}", 400, None, None),
    (CH, b'{"messages": [' + b"{" * 50000, 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "a": ' + b"[" * 64 + b"]" * 64 + b"}", 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "max_tokens": 1e400}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "foo": -1e400}', 400, None, "invalid_json"),
    (C, b'{"prompt": "x", "logit_bias": {"5": 1e400}}', 400, None, "invalid_json"),
    # missing fields and wrong types
    (C, {}, 400, "prompt", "missing_required_parameter"),
    (C, {"prompt": None}, 400, "prompt", "missing_required_parameter"),
    (C, {"prompt": 5}, 400, "prompt", "invalid_type"),
    (C, {"prompt": {"text": "x"}}, 400, "prompt", "invalid_type"),
    (C, {"prompt": []}, 400, "prompt", None),
    (C, {"prompt": [[]]}, 400, None, None),
    (C, {"prompt": ["a"] * 65}, 400, "prompt", "unsupported_parameter"),
    (C, {"prompt": [[1], [99999999]]}, 400, "prompt[1]", "invalid_value"),
    (C, {"prompt": [1, "a"]}, 400, None, "invalid_type"),
    (C, {"prompt": ["a", 1]}, 400, None, "invalid_type"),
    (C, {"prompt": [-1]}, 400, None, None),
    (C, {"prompt": [999999]}, 400, "prompt", None),
    (C, {"prompt": [1.5]}, 400, None, "invalid_type"),
    (C, {"prompt": "x", "max_tokens": "10"}, 400, "max_tokens", "invalid_type"),
    (C, {"prompt": "x", "max_tokens": 0}, 400, "max_tokens", None),
    (C, {"prompt": "x", "max_tokens": -5}, 400, "max_tokens", None),
    (C, {"prompt": "x", "max_tokens": 1.5}, 400, "max_tokens", "invalid_type"),
    (C, {"prompt": "x", "max_tokens": 10**30}, 400, "max_tokens", None),
    (C, {"prompt": "x", "max_tokens": 1025}, 400, "max_tokens", None),
    (C, {"prompt": "x", "max_tokens": 1024}, 400, "max_tokens", "context_length_exceeded"),
    (C, {"prompt": "x", "temperature": -0.1}, 400, "temperature", "invalid_value"),
    (C, {"prompt": "x", "temperature": 2.5}, 400, "temperature", None),
    (C, {"prompt": "x", "temperature": "hot"}, 400, "temperature", "invalid_type"),
    (C, {"prompt": "x", "temperature": True}, 400, "temperature", "invalid_type"),
    (C, {"prompt": "x", "top_p": 1.5}, 400, "top_p", None),
    (C, {"prompt": "x", "top_p": -0.1}, 400, "top_p", None),
    (C, {"prompt": "x", "top_k": -2}, 400, "top_k", None),
    (C, {"prompt": "x", "min_p": 2}, 400, "min_p", None),
    (C, {"prompt": "x", "n": 17}, 400, "n", "unsupported_parameter"),
    (C, {"prompt": "x", "n": 129}, 400, "n", "invalid_value"),
    (C, {"prompt": "x", "n": 0}, 400, "n", None),
    (C, {"prompt": "x", "best_of": 3}, 400, "best_of", None),
    (C, {"prompt": "x", "stream": "yes"}, 400, "stream", "invalid_type"),
    (C, {"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", None),
    (C, {"prompt": "x", "stream": True, "stream_options": {"bogus": 1}}, 400, None, "unknown_parameter"),
    (C, {"prompt": "x", "stop": 5}, 400, "stop", "invalid_type"),
    (C, {"prompt": "x", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop", None),
    (C, {"prompt": "x", "stop": [""]}, 400, None, None),
    (C, {"prompt": "x", "stop": ""}, 400, None, None),
    (C, {"prompt": "x", "stop": [1]}, 400, None, "invalid_type"),
    (C, {"prompt": "x", "seed": "1"}, 400, "seed", "invalid_type"),
    (C, {"prompt": "x", "seed": 1.5}, 400, "seed", "invalid_type"),
    (C, {"prompt": "x", "model": 5}, 400, "model", "invalid_type"),
    (C, {"prompt": "x", "user": 5}, 400, "user", "invalid_type"),
    (C, {"prompt": "x", "ignore_eos": "yes"}, 400, "ignore_eos", "invalid_type"),
    # unknown parameters and unsupported features
    (C, {"prompt": "x", "foo": 1}, 400, "foo", "unknown_parameter"),
    (C, {"prompt": "x", "messages": USER}, 400, "messages", "unknown_parameter"),
    (C, {"prompt": "x", "presence_penalty": "high"}, 400, "presence_penalty", "invalid_type"),
    (C, {"prompt": "x", "frequency_penalty": 3}, 400, "frequency_penalty", None),
    (C, {"prompt": "x", "logit_bias": {"abc": 5}}, 400, "logit_bias.abc", "invalid_value"),
    (C, {"prompt": "x", "logit_bias": {"1": 101}}, 400, "logit_bias.1", "invalid_value"),
    (C, {"prompt": "x", "logit_bias": {"99999999": 1}}, 400, "logit_bias.99999999", "invalid_value"),
    (C, {"prompt": "x", "logit_bias": {"1": "5"}}, 400, "logit_bias.1", "invalid_type"),
    (C, {"prompt": "x", "logit_bias": [1]}, 400, "logit_bias", "invalid_type"),
    (C, {"prompt": "x", "logprobs": 6}, 400, "logprobs", "invalid_value"),
    (C, {"prompt": "x", "logprobs": True}, 400, "logprobs", "invalid_type"),
    (C, {"prompt": "x", "echo": "yes"}, 400, "echo", "invalid_type"),
    (CH, {"messages": [{"role": "user", "content": "x"}], "echo": True}, 400, "echo", None),
    (CH, {"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, 400, "max_tokens", None),
    (C, {"prompt": "x", "suffix": "end"}, 400, "suffix", "unsupported_parameter"),
    # context
    (C, {"prompt": "word " * 3000}, 400, "prompt", "context_length_exceeded"),
    (C, {"prompt": "word " * 3000, "max_tokens": 5}, 400, "prompt", "context_length_exceeded"),
    # chat
    (CH, {}, 400, "messages", "missing_required_parameter"),
    (CH, {"messages": []}, 400, "messages", None),
    (CH, {"messages": "hi"}, 400, "messages", "invalid_type"),
    (CH, {"messages": [1]}, 400, "messages[0]", "invalid_type"),
    (CH, {"messages": [{"content": "x"}]}, 400, "messages[0].role", "missing_required_parameter"),
    (CH, {"messages": [{"role": 1, "content": "x"}]}, 400, "messages[0].role", "invalid_type"),
    (CH, {"messages": [{"role": "wizard", "content": "x"}]}, 400, "messages[0].role", None),
    (CH, {"messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].tool_call_id",
     "missing_required_parameter"),
    (CH, {"messages": [{"role": "function", "content": "x"}]}, 400, "messages[0].role", "unsupported_parameter"),
    (CH, {"messages": [{"role": "user"}]}, 400, "messages[0].content", "missing_required_parameter"),
    (CH, {"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content", None),
    (CH, {"messages": [{"role": "user", "content": 5}]}, 400, "messages[0].content", "invalid_type"),
    (CH, {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, None, None),
    (CH, {"messages": [{"role": "user", "content": [{"type": "text"}]}]}, 400, None, None),
    (CH, {"messages": [{"role": "user", "content": "x", "extra": 1}]}, 400, "messages[0].extra", "unknown_parameter"),
    (CH, {"messages": [{"role": "user", "content": "x", "refusal": None}]}, 400, None, "unknown_parameter"),
    (CH, {"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]},
     400, "messages[0].tool_calls[0].function", "missing_required_parameter"),
    (CH, {"messages": [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": "{'a': 1}"}}]}]},
     400, "messages[0].tool_calls[0].function.arguments", "invalid_value"),
    (CH, {"messages": USER, "tools": [{"type": "retrieval"}]}, 400, "tools[0].type", "unsupported_parameter"),
    (CH, {"messages": USER, "tools": {"name": "f"}}, 400, "tools", "invalid_type"),
    (CH, {"messages": USER, "tools": [{"type": "function", "function": {"name": "a b"}}]}, 400,
     "tools[0].function.name", "invalid_value"),
    (CH, {"messages": USER, "tool_choice": "required"}, 400, "tool_choice", None),
    (CH, {"messages": USER, "tools": [{"type": "function", "function": {"name": "f"}}],
          "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400, "tool_choice.function.name",
     "invalid_value"),
    (CH, {"messages": USER, "tool_choice": "required", "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": {"s": {"patternProperties": {"^a": {}}}}}}}]}, 400,
     "tools[0].function.parameters", "invalid_value"),
    (CH, {"messages": USER, "tool_choice": "required", "response_format": {"type": "json_object"},
          "tools": [{"type": "function", "function": {"name": "f"}}]}, 400, "response_format", "invalid_value"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema"}}, 400, "response_format.json_schema",
     "missing_required_parameter"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, 400,
     "response_format.json_schema.name", "missing_required_parameter"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "a b"}}}, 400,
     "response_format.json_schema.name", "invalid_value"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema",
                                                "json_schema": {"name": "x", "schema": {"pattern": "(a"}}}},
     400, "response_format.json_schema.schema", "invalid_value"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema",
                                                "json_schema": {"name": "x", "schema": {"$ref": "#/nowhere"}}}},
     400, "response_format.json_schema.schema", "invalid_value"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": 3}}},
     400, "response_format.json_schema.schema", "invalid_type"),
    (CH, {"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "y": 1}}},
     400, "response_format.json_schema.y", "unknown_parameter"),
    (CH, {"messages": USER, "response_format": {"type": "text", "json_schema": {"name": "x"}}}, 400,
     "response_format.json_schema", "unknown_parameter"),
    (CH, {"messages": USER, "response_format": {"type": "yaml"}}, 400, "response_format",
     "unsupported_parameter"),
    (CH, {"messages": USER, "response_format": {"type": "json_object", "x": 1}}, 400,
     "response_format.x", "unknown_parameter"),
    (CH, {"messages": USER, "logprobs": 1}, 400, "logprobs", "invalid_type"),
    (CH, {"messages": USER, "top_logprobs": 2}, 400, "top_logprobs", "invalid_value"),
    (CH, {"messages": USER, "logprobs": True, "top_logprobs": 21}, 400, "top_logprobs", "invalid_value"),
    (CH, {"messages": USER, "prompt": "x"}, 400, "prompt", "unknown_parameter"),
    (CH, {"messages": USER, "n": 17}, 400, "n", "unsupported_parameter"),
    (CH, {"messages": USER, "temperature": -1}, 400, "temperature", None),
    (CH, {"messages": USER, "max_completion_tokens": 0}, 400, "max_completion_tokens", None),
    (CH, {"messages": [{"role": "user", "content": "word " * 3000}]}, 400, "messages", "context_length_exceeded"),
]

# Accepted at neutral values (what some clients always send).
ACCEPTED = [
    (C, {"prompt": "x", "max_tokens": 2, "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {},
         "logprobs": None, "echo": False, "suffix": "", "best_of": 1, "n": 1, "user": "u", "model": "any",
         "stop": [], "seed": -3, "top_p": 0}),
    (CH, {"messages": [{"role": "developer", "content": "Be brief."},
                       {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                       {"role": "assistant", "content": None, "refusal": None, "tool_calls": []},
                       {"role": "user", "content": "c", "name": "bob"}],
          "max_completion_tokens": 2, "tools": [], "tool_choice": "none", "parallel_tool_calls": True,
          "response_format": {"type": "text"}, "logprobs": False, "top_logprobs": 0, "stream_options": None,
          "seed": 18446744073709551615}),
]


def check_error_shape(body):
    assert isinstance(body, dict) and set(body) == {"error"}, body
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    assert err["param"] is None or isinstance(err["param"], str)
    assert err["code"] is None or isinstance(err["code"], str)


@pytest.mark.parametrize("endpoint,payload,status,param,code", MATRIX,
                         ids=[f"{i}-{m[0].split('/')[-1]}" for i, m in enumerate(MATRIX)])
def test_bad_request_matrix(server, endpoint, payload, status, param, code):
    raw = payload if isinstance(payload, bytes) else None
    got_status, body = post(server.url + endpoint, None if raw is not None else payload, raw=raw)
    assert got_status == status, body
    check_error_shape(body)
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body


@pytest.mark.parametrize("endpoint,payload", ACCEPTED)
def test_neutral_values_of_unsupported_parameters_are_accepted(server, endpoint, payload):
    status, body = post(server.url + endpoint, payload)
    assert status == 200, body


def test_server_is_healthy_after_the_matrix(server):
    status, body = server.get("/health")
    assert status == 200 and json.loads(body) == {"status": "ok"}
    m = server.metrics()
    assert m.get('quantspec_http_requests_total{endpoint="/v1/completions",status="400"}', 0) >= 40


def response_complete(data):
    """Whether `data` holds a whole HTTP response (headers and a Content-Length body)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(body) >= int(value.strip())
    return False


def raw_http(port, data, timeout=10.0, gaps=None):
    """Send bytes (a list of parts, with optional sleeps between) and read one response (or until
    the server closes the connection)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        parts = data if isinstance(data, list) else [data]
        for i, part in enumerate(parts):
            try:
                s.sendall(part)
            except OSError:
                break
            if gaps and i < len(parts) - 1:
                time.sleep(gaps)
        out = b""
        while not response_complete(out):
            try:
                chunk = s.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def status_and_body(response):
    """Status and body of the first response in `response` (more may follow on the connection)."""
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1]) if head.startswith(b"HTTP/1.1 ") else None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            body = body[:int(value.strip())]
    return status, body


@pytest.mark.parametrize("method,path,status", [
    ("GET", "/v1/completions", 405), ("POST", "/health", 405), ("DELETE", "/v1/models", 405),
    ("PUT", "/v1/chat/completions", 405), ("TRACE", "/metrics", 405), ("GET", "/nope", 404),
    ("POST", "/v1/completions/extra", 404), ("GET", "/v1", 404)])
def test_wrong_method_or_path(server, method, path, status):
    req = f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}"
    got, body = status_and_body(raw_http(server.port, req.encode()))
    assert got == status
    check_error_shape(json.loads(body))


def test_malformed_http(server):
    for req in (b"GARBAGE\r\n\r\n", b"GET / HTTP/9.9\r\nHost: x\r\n\r\n", b"\x00\x01\x02\r\n\r\n",
                b"POST /v1/completions HTTP/1.1\r\nContent-Length: nope\r\n\r\n{}"):
        got, body = status_and_body(raw_http(server.port, req, timeout=5))
        assert got is not None and 400 <= got < 500, req
        check_error_shape(json.loads(body))
    got, _ = status_and_body(raw_http(server.port, b"GET /" + b"a" * 20000 + b" HTTP/1.1\r\n\r\n", timeout=5))
    assert got in (400, 414)
    assert server.get("/health")[0] == 200


def read_until_closed(port, data, timeout=15.0):
    """Send bytes and read every answer until the server closes the connection: (bytes, seconds
    until the close)."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    t0 = time.monotonic()
    out = b""
    try:
        s.sendall(data)
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
    except (socket.timeout, ConnectionResetError):
        pass
    finally:
        s.close()
    return out, time.monotonic() - t0


def test_untrustworthy_content_length_is_refused_and_the_connection_closed(server):
    """Two Content-Length headers, or one that is not a number: which body length is meant is
    unknown, so the answer is 400 and nothing after it on the connection is read (a second
    request hidden in the body gets no answer)."""
    body = b'{"prompt": "hi", "max_tokens": 2}'
    hidden = b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
    for lengths in ([len(body), len(body) + len(hidden)], [f"{len(body)}x"], ["-5"]):
        head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n" + b"".join(
            f"Content-Length: {n}\r\n".encode() for n in lengths) + b"\r\n"
        out, seconds = read_until_closed(server.port, head + body + hidden)
        got, err = status_and_body(out)
        assert got == 400, out
        check_error_shape(json.loads(err))
        assert "Content-Length" in json.loads(err)["error"]["message"]
        assert out.count(b"HTTP/1.1 ") == 1, out  # the hidden request was not served
        assert seconds < 3, seconds  # closed at once, not at the keep-alive timeout (5 s)


def test_transfer_codings_other_than_chunked_are_501(server):
    body = b'{"prompt": "hi", "max_tokens": 2}'
    for te in (b"gzip", b"gzip, chunked"):
        out, seconds = read_until_closed(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x"
                                         b"\r\nTransfer-Encoding: " + te + b"\r\n\r\n" + body)
        got, err = status_and_body(out)
        assert got == 501, out
        check_error_shape(json.loads(err))
        assert json.loads(err)["error"]["code"] == "not_implemented"
        assert seconds < 3, seconds  # answered and closed at once (it waited 10 s for a body)
    chunked = b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
    out = raw_http(server.port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   b"Transfer-Encoding: Chunked\r\n\r\n" + chunked)
    assert status_and_body(out)[0] == 200, out


def test_multipart_body_is_415(server):
    boundary = "zz"
    form = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"prompt\"\r\n\r\nhi\r\n"
            f"--{boundary}--\r\n").encode()
    status, body = post(server.url + C, None, raw=form,
                        headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
    assert status == 415, body
    check_error_shape(body)
    assert body["error"]["code"] == "unsupported_media_type"
    assert "JSON" in body["error"]["message"]


def test_range_header_does_not_cut_api_answers(server):
    """Byte ranges are for files: an API answer (or an error) comes whole, with status 200 / 4xx."""
    for payload, want in (({"prompt": "hi", "max_tokens": 2}, 200), ({"prompt": 5}, 400)):
        status, body = post(server.url + C, payload, headers={"Range": "bytes=0-5"})
        assert status == want and isinstance(body, dict), body
    req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nRange: bytes=0-3,10-20\r\nConnection: close\r\n\r\n"
    out = raw_http(server.port, req)
    got, text = status_and_body(out)
    assert got == 200 and b"quantspec_http_requests_total" in text and b"Content-Range" not in out


def test_a_second_server_on_the_same_port_fails(server, quantspec_binary):
    import subprocess
    from serverlib import REPO
    p = subprocess.run([quantspec_binary, "serve", "-m", f"{REPO}/models/test/llama3-tiny",
                        "--port", str(server.port)], capture_output=True, text=True, timeout=60)
    assert p.returncode == 1 and "cannot listen" in p.stderr, p.stderr


@pytest.fixture(scope="module")
def strict(start_server, chat_models):
    """A server with small limits, for body-size and slow-client tests."""
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "256", "--max-body", "65536",
                     "--read-timeout", "1", "--request-deadline", "3", "--keep-alive", "2")
    yield s
    assert s.alive(), s.stderr


def test_huge_body_with_content_length(strict):
    body = json.dumps({"prompt": "x" * 200000}).encode()
    status, reply = post(strict.url + C, None, raw=body)
    assert status == 413
    check_error_shape(reply)
    assert reply["error"]["code"] == "request_too_large"


def test_huge_chunked_body(strict):
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
    chunk = b"4000\r\n" + b"x" * 0x4000 + b"\r\n"
    got, body = status_and_body(raw_http(strict.port, [head] + [chunk] * 16 + [b"0\r\n\r\n"], timeout=10))
    assert got == 413
    check_error_shape(json.loads(body))
    assert strict.get("/health")[0] == 200


def test_slow_headers_get_400(strict):
    start = time.monotonic()
    reply = raw_http(strict.port, [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n", b"X-A: 1\r\n"], gaps=1.6)
    got, body = status_and_body(reply)
    assert got == 400
    check_error_shape(json.loads(body))
    assert time.monotonic() - start < 5


def test_slow_body_gets_400(strict):
    reply = raw_http(strict.port, [b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 40\r\n\r\n{\"pro",
                                   b"mpt\": \"x\"}"], gaps=1.6)
    got, body = status_and_body(reply)
    assert got == 400
    check_error_shape(json.loads(body))


def test_slow_request_line_is_dropped(strict):
    start = time.monotonic()
    reply = raw_http(strict.port, [b"POST /v1/compl", b"etions HTTP/1.1\r\n\r\n"], gaps=1.6)
    # cpp-httplib gives up on a request line that stalls past the read timeout without an answer.
    assert reply == b"" or status_and_body(reply)[0] == 400
    assert time.monotonic() - start < 5


def test_drip_fed_headers_are_cut_off_at_the_deadline(strict):
    """Slowloris: one header byte at a time, each within the read timeout, forever."""
    s = socket.create_connection(("127.0.0.1", strict.port), timeout=10)
    start = time.monotonic()
    s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
    reply = b""
    try:
        while time.monotonic() - start < 15:
            try:
                s.sendall(b"a")
            except OSError:
                break
            s.settimeout(0.4)
            try:
                chunk = s.recv(65536)
                if not chunk:
                    break
                reply += chunk
                break
            except socket.timeout:
                continue
            except ConnectionResetError:
                break
    finally:
        s.close()
    elapsed = time.monotonic() - start
    # --request-deadline 3: cut then (+ the watchdog's period and slack), not by the read timeout.
    assert 2.0 < elapsed < 3 + 2.5, elapsed
    assert reply == b"" or status_and_body(reply)[0] == 400


def test_slow_clients_do_not_block_others(strict):
    """Many stalled connections at once: the server keeps answering."""
    conns = []
    for _ in range(20):
        c = socket.create_connection(("127.0.0.1", strict.port), timeout=10)
        c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{")
        conns.append(c)
    try:
        start = time.monotonic()
        assert strict.get("/health", timeout=5)[0] == 200
        status, body = post(strict.url + C, {"prompt": "hi", "max_tokens": 2})
        assert status == 200, body
        assert time.monotonic() - start < 3
    finally:
        for c in conns:
            c.close()


def test_chat_template_errors_are_400(start_server, chat_models):
    s = start_server("-m", chat_models["llama2-tiny"], "--ctx", "256")
    try:
        status, body = post(s.url + CH, {"messages": [{"role": "user", "content": "a"},
                                                      {"role": "user", "content": "b"}]})
        assert status == 400
        check_error_shape(body)
        assert body["error"]["code"] == "chat_template_error"
        assert "Conversation roles must alternate" in body["error"]["message"]
    finally:
        s.stop()


def test_chat_without_a_template_explains_the_fix(start_server):
    from serverlib import REPO
    s = start_server("-m", f"{REPO}/models/test/qwen2-tiny", "--ctx", "256")
    try:
        status, body = post(s.url + CH, {"messages": USER})
        assert status == 400
        assert body["error"]["code"] == "chat_template_missing"
        assert "--chat-template" in body["error"]["message"]
        status, _ = post(s.url + C, {"prompt": "hi", "max_tokens": 2})
        assert status == 200
        assert "chat template: none" in s.stderr
    finally:
        s.stop()
    # --chat-template fixes it
    s = start_server("-m", f"{REPO}/models/test/qwen2-tiny", "--ctx", "256", "--chat-template", "chatml")
    try:
        status, body = post(s.url + CH, {"messages": USER, "max_tokens": 2})
        assert status == 200, body
    finally:
        s.stop()


def test_bad_command_lines(quantspec_binary, tmp_path):
    import subprocess
    from serverlib import REPO

    def run(*args):
        return subprocess.run([quantspec_binary, "serve", *args], capture_output=True, text=True, timeout=60)

    p = run("-m", f"{REPO}/models/test/llama3-tiny", "--chat-template", "nonsense")
    assert p.returncode == 1 and "neither a built-in" in p.stderr
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% filter upper %}x{% endfilter %}")
    p = run("-m", f"{REPO}/models/test/llama3-tiny", "--chat-template", str(bad))
    assert p.returncode == 1 and "unsupported tag '{% filter %}'" in p.stderr
    p = run("-m", str(tmp_path / "missing"))
    assert p.returncode == 1 and "error" in p.stderr
    p = run("--port", "70000")
    assert p.returncode == 2
    p = run("-m", f"{REPO}/models/test/llama3-tiny", "--temperature", "-1")
    assert p.returncode == 1
    # a port in use
    blocker = socket.socket()
    blocker.bind(("127.0.0.1", 0))
    blocker.listen()
    try:
        p = run("-m", f"{REPO}/models/test/llama3-tiny", "--port", str(blocker.getsockname()[1]))
        assert p.returncode == 1 and "cannot listen" in p.stderr
    finally:
        blocker.close()


def test_unsupported_model_template_is_reported_and_chat_refused(start_server, tmp_path):
    import os
    from serverlib import REPO
    src = f"{REPO}/models/test/llama3-tiny"
    for f in os.listdir(src):
        if f != "tokenizer_config.json":
            os.symlink(os.path.join(src, f), tmp_path / f)
    cfg = json.load(open(f"{src}/tokenizer_config.json"))
    cfg["chat_template"] = "{% for m in messages %}\n{% filter upper %}{{ m.content }}{% endfilter %}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(cfg))
    s = start_server("-m", str(tmp_path), "--ctx", "256")
    try:
        assert "unsupported tag '{% filter %}'" in s.stderr and "line 2" in s.stderr
        status, body = post(s.url + CH, {"messages": USER})
        assert status == 400 and body["error"]["code"] == "chat_template_missing"
        assert "{% filter %}" in body["error"]["message"]
        assert post(s.url + C, {"prompt": "x", "max_tokens": 1})[0] == 200
    finally:
        s.stop()
