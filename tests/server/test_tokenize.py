"""POST /tokenize and /detokenize (vLLM's endpoints): the ids a request runs as, so that a client
can check that a long document fits the context before sending it; and their text back."""
from serverlib import post

USER = [{"role": "user", "content": "Which book comes after Genesis?"}]


def test_tokenize_counts_what_a_request_runs(start_server, chat_models):
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "512")
    try:
        status, tok = post(s.url + "/tokenize", {"prompt": "The Lord said unto Moses"})
        assert status == 200, tok
        assert tok["count"] == len(tok["tokens"]) and tok["max_model_len"] == 512
        status, body = post(s.url + "/v1/completions",
                            {"prompt": "The Lord said unto Moses", "max_tokens": 1})
        assert status == 200 and body["usage"]["prompt_tokens"] == tok["count"]
        # The same ids as a token prompt: the same request.
        status, again = post(s.url + "/v1/completions", {"prompt": tok["tokens"], "max_tokens": 1})
        assert status == 200 and again["usage"]["prompt_tokens"] == tok["count"]

        status, plain = post(s.url + "/tokenize", {"prompt": "The Lord said unto Moses",
                                                   "add_special_tokens": False})
        assert status == 200 and plain["tokens"] == tok["tokens"][1:]  # without the BOS

        status, chat = post(s.url + "/tokenize", {"messages": USER})
        assert status == 200, chat
        status, body = post(s.url + "/v1/chat/completions", {"messages": USER, "max_tokens": 1})
        assert status == 200 and body["usage"]["prompt_tokens"] == chat["count"]

        status, text = post(s.url + "/detokenize", {"tokens": plain["tokens"]})
        assert status == 200 and text == {"prompt": "The Lord said unto Moses"}
        status, text = post(s.url + "/detokenize", {"tokens": chat["tokens"]})
        assert status == 200 and "Which book comes after Genesis?" in text["prompt"]
        assert text["prompt"].startswith("<|begin_of_text|>")  # special tokens included
    finally:
        s.stop()


def test_tokenize_bad_input(start_server, chat_models):
    s = start_server("-m", chat_models["llama3-tiny"], "--ctx", "512")
    try:
        cases = [
            ("/tokenize", {}, "prompt", "missing_required_parameter"),
            ("/tokenize", {"prompt": "a", "messages": USER}, "messages", "invalid_value"),
            ("/tokenize", {"prompt": 5}, "prompt", "invalid_type"),
            ("/tokenize", {"prompt": None}, "prompt", "invalid_type"),
            ("/tokenize", {"messages": None}, "messages", "invalid_type"),
            ("/tokenize", {"prompt": None, "messages": USER}, "messages", "invalid_value"),
            ("/tokenize", {"prompt": "a", "bogus": 1}, "bogus", "unknown_parameter"),
            ("/tokenize", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role", None),
            ("/tokenize", {"prompt": "a", "add_special_tokens": "yes"}, "add_special_tokens", "invalid_type"),
            ("/tokenize", {"prompt": "a", "tools": []}, "tools", "invalid_value"),
            ("/tokenize", {"messages": USER, "tools": [{"type": "x"}]}, "tools[0].type", "unsupported_parameter"),
            ("/tokenize", {"messages": USER, "tool_choice": "auto"}, "tool_choice", "unknown_parameter"),
            ("/detokenize", {}, "tokens", "missing_required_parameter"),
            ("/detokenize", {"tokens": "x"}, "tokens", "invalid_type"),
            ("/detokenize", {"tokens": [-1]}, "tokens[0]", "invalid_value"),
            ("/detokenize", {"tokens": [10 ** 8]}, "tokens", "invalid_value"),
        ]
        for path, payload, param, code in cases:
            status, body = post(s.url + path, payload)
            assert status == 400, (path, payload, body)
            assert body["error"]["param"] == param, (payload, body)
            if code:
                assert body["error"]["code"] == code, (payload, body)
        status, body = post(s.url + "/tokenize", None, raw=b"{not json")
        assert status == 400 and body["error"]["code"] == "invalid_json"
        assert s.alive()
    finally:
        s.stop()
