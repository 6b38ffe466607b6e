"""What one client cannot do to the others: send a body over --max-request-bytes (a 413 before it is parsed), queue
more choices (prompts x n) than --max-choices-per-request in one request (a 400 before anything reaches the engine),
or hold the engine by never reading its stream (issue 38: updates go to a per-request queue with room for all of
them, so routing never waits on the client)."""

import json
import socket
import time

LIMIT = 4 << 20  # serve's default --max-request-bytes


def test_oversized_body_is_413_by_content_length(http):
    resp = http.post("/v1/completions", json={"prompt": "x" * (LIMIT + 1), "max_tokens": 1})
    assert resp.status_code == 413
    error = resp.json()["error"]
    assert error["code"] == 413 and error["param"] is None and "--max-request-bytes" in error["message"]
    assert http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}).status_code == 200


def test_oversized_chunked_body_is_413(http):
    """No Content-Length (chunked): counted as it arrives."""
    chunks = [b'{"prompt": "', *[b"x" * (1 << 20)] * 5, b'", "max_tokens": 1}']
    resp = http.post("/v1/completions", content=iter(chunks), headers={"Content-Type": "application/json"})
    assert resp.status_code == 413 and resp.json()["error"]["type"] == "RequestTooLargeError"


def test_body_under_the_limit_is_read_whole(http):
    """A chunked body under the limit reaches the route intact (the middleware replays it)."""
    body = json.dumps({"prompt": "Hi", "max_tokens": 1, "user": "u" * 100_000}).encode()
    chunks = [body[i : i + 4096] for i in range(0, len(body), 4096)]
    resp = http.post("/v1/completions", content=iter(chunks), headers={"Content-Type": "application/json"})
    assert resp.status_code == 200 and resp.json()["choices"]


def test_more_choices_than_the_server_takes_is_400(http):
    """serve's default --max-choices-per-request, 128: OpenAI's cap on n."""
    resp = http.post("/v1/completions", json={"prompt": [[1]] * 129, "max_tokens": 1})
    assert resp.status_code == 400 and resp.json()["error"]["param"] == "prompt"
    assert "--max-choices-per-request" in resp.json()["error"]["message"]
    resp = http.post("/v1/completions", json={"prompt": [[1], [2]], "n": 128, "max_tokens": 1})
    error = resp.json()["error"]
    assert resp.status_code == 400 and error["param"] == "n" and "must be in [1, 64]" in error["message"], error


def raw_stream_request(port: int, api_key: str, body: dict) -> socket.socket:
    """A streamed request on a socket nobody reads, with a small receive buffer so the server's sends back up."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", port))
    data = json.dumps(body).encode()
    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {api_key}\r\n"
    head += f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock.sendall(head.encode() + data)
    return sock


def read_all(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    chunks = []
    while not chunks or not chunks[-1].endswith(b"data: [DONE]\n\n") and chunks[-1]:
        chunks.append(sock.recv(1 << 16))
    return b"".join(chunks)


def test_client_that_never_reads_its_stream_does_not_block_the_engine(http, base_url, api_key, metric):
    """Big chunks (echo: the prompt's 20 top logprobs per token) to a client that reads nothing: another request
    still completes, the engine finishes the unread one, and its whole stream is there once read."""
    prompt = list(range(1000, 1120))
    body = {"prompt": prompt, "max_tokens": 6, "ignore_eos": True, "logprobs": 20, "echo": True, "n": 2}
    sock = raw_stream_request(int(base_url.rsplit(":", 1)[1]), api_key, {**body, "stream": True})
    try:
        start = time.monotonic()
        resp = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1}, timeout=60)
        assert resp.status_code == 200 and resp.json()["choices"]
        while metric("qwen3_runtime_num_requests_running") + metric("qwen3_runtime_num_requests_waiting") > 0:
            assert time.monotonic() - start < 120, "the engine did not finish the unread request"
            time.sleep(0.2)
        text = read_all(sock, timeout=30).decode()
    finally:
        sock.close()
    events = [line[6:] for line in text.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(text) > 100_000
    chunks = [json.loads(e) for e in events[:-1]]
    assert sorted(c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]) == [0, 1]
