"""The bundled default model (models/default) serves chat with its own chat_template."""
from serverlib import REPO, post

CH = "/v1/chat/completions"


def test_bundled_model_chat_uses_its_template(start_server):
    s = start_server("-m", f"{REPO}/models/default", "--ctx", "512")
    try:
        messages = [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Who wrote the Book of Genesis?"}]
        status, body = post(s.url + CH, {"messages": messages, "max_tokens": 8, "temperature": 0})
        assert status == 200, body
        assert body["choices"][0]["finish_reason"] in ("stop", "length")
        assert body["usage"]["completion_tokens"] >= 1
        # BOS + "Be brief.\n\nUser: Who wrote the Book of Genesis?\n\nAssistant:" as rendered by
        # the template: more than the raw message text alone.
        assert body["usage"]["prompt_tokens"] > 12
        assert "chat template: none" not in s.stderr
        status, body = post(s.url + CH, {"messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]})
        assert status == 400, body  # raise_exception in the template: the role is not supported
    finally:
        s.stop()


def test_startup_names_the_context_the_model_allows(start_server):
    """A server's context is fixed at start: without --ctx it is min(model max, 8192), and the
    resolved configuration says how far --ctx could take it; with --ctx nothing is added."""
    s = start_server("-m", f"{REPO}/models/default")
    try:
        assert "context: 8192 tokens, fixed while serving; the model allows 16384" in s.stderr
    finally:
        s.stop()
    s = start_server("-m", f"{REPO}/models/default", "--ctx", "512")
    try:
        assert "fixed while serving" not in s.stderr
    finally:
        s.stop()
