"""The real uvicorn retrieval server on 127.0.0.1: Search-R1's wire format, the CLI."""

import json
import os
import socket
import subprocess
import sys
import threading
import time

import pytest
import requests

from hybridrl.agents.retrieval import BM25Index, HttpRetriever
from hybridrl.agents.retrieval_server import (
    MAX_BODY_BYTES,
    MAX_QUERIES,
    MAX_QUERY_CHARS,
    MAX_TOPK,
    create_app,
    main,
)

DOCS = [
    {"id": "a", "contents": '"Paris"\nParis is the capital and most populous city of France.'},
    {"id": "b", "contents": '"Lyon"\nLyon is a big city of France, on the Rhone.'},
    {"id": "c", "contents": '"Jupiter"\nJupiter is the largest planet in the Solar System.'},
    {"id": "d", "contents": '"Moon"\nThe Moon is Earth\'s only natural satellite.'},
]


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("server_corpus") / "corpus.jsonl"
    path.write_text("".join(json.dumps(d) + "\n" for d in DOCS), encoding="utf-8")
    return str(path)


@pytest.fixture(scope="module")
def index(corpus_path):
    return BM25Index.build(corpus_path)


@pytest.fixture(scope="module")
def server_url(index):
    """uvicorn serving create_app(index, default_topk=1) in a thread, on a socket bound here."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_app(index, default_topk=1), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):  # at most ~10 s
        if server.started:
            break
        time.sleep(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def _post(url, payload):
    resp = requests.post(url + "/retrieve", json=payload, timeout=10)
    return resp.status_code, resp.json()


def test_wire_format_with_scores(server_url, index):
    status, body = _post(
        server_url, {"queries": ["capital of France", "largest planet"], "topk": 2, "return_scores": True}
    )
    assert status == 200 and list(body) == ["result"]
    result = body["result"]
    assert [[hit["document"]["id"] for hit in hits] for hits in result] == [["a", "b"], ["c"]]
    for hits in result:
        for hit in hits:
            assert set(hit) == {"document", "score"} and set(hit["document"]) == {"id", "contents"}
            assert isinstance(hit["score"], float) and hit["score"] > 0
    assert result[0][0]["document"] == DOCS[0]
    assert result == index.search(["capital of France", "largest planet"], 2)  # scores survive JSON exactly


def test_wire_format_without_scores_and_default_topk(server_url):
    status, body = _post(server_url, {"queries": ["capital of France", "quark gluon"], "topk": 2})
    assert status == 200
    assert body == {"result": [[DOCS[0], DOCS[1]], []]}  # a plain list of documents per query
    status, body = _post(server_url, {"queries": ["France"]})  # no topk: the server's default (1)
    assert status == 200 and len(body["result"][0]) == 1


def test_bad_requests_are_rejected(server_url):
    assert requests.post(server_url + "/retrieve", json={"queries": ["x"], "topk": 0}, timeout=10).status_code == 422
    assert requests.post(server_url + "/retrieve", json={"topk": 2}, timeout=10).status_code == 422
    # caps: the answer's size and the search's CPU time are bounded before any search runs
    for body in (
        {"queries": ["x"], "topk": MAX_TOPK + 1},
        {"queries": ["x"] * (MAX_QUERIES + 1)},
        {"queries": ["word " * MAX_QUERY_CHARS]},
    ):
        assert requests.post(server_url + "/retrieve", json=body, timeout=10).status_code == 422
    at_caps = {"queries": ["x" * MAX_QUERY_CHARS] * MAX_QUERIES, "topk": MAX_TOPK}
    assert requests.post(server_url + "/retrieve", json=at_caps, timeout=30).status_code == 200
    health = requests.get(server_url + "/health", timeout=10)
    assert health.status_code == 200 and health.json() == {"status": "ok", "num_docs": 4}


def test_http_retriever_against_the_server(server_url, index):
    retriever = HttpRetriever(server_url + "/retrieve", timeout_s=10)
    queries = ["Lyon on the Rhone", "Earth satellite", "capital"]
    assert retriever.retrieve(queries, 3) == index.search(queries, 3)


def test_cli_index_then_serve(tmp_path, corpus_path, capsys):
    index_dir = str(tmp_path / "idx")
    assert main(["index", "--corpus", corpus_path, "--index_dir", index_dir]) == 0
    assert "indexed 4 passages" in capsys.readouterr().out
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "hybridrl.cli",
        "retriever",
        "serve",
        "--index_dir",
        index_dir,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--topk",
        "2",
    ]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        body = None
        for _ in range(300):  # at most ~30 s for the interpreter to start and bind
            try:
                body = requests.post(
                    f"http://127.0.0.1:{port}/retrieve", json={"queries": ["France"]}, timeout=5
                ).json()
                break
            except requests.ConnectionError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        assert body is not None and sorted(d["id"] for d in body["result"][0]) == ["a", "b"]  # --topk 2
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_cli_errors_are_one_line(tmp_path, capsys, corpus_path):
    assert main(["serve", "--corpus", corpus_path, "--port", "99999"]) == 2  # before building the index
    err = capsys.readouterr().err.strip()
    assert err == "hybridrl retriever: error: --port 99999: not a TCP port (0-65535; 0 picks a free one)"
    assert main(["serve", "--port", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hybridrl retriever: error: retriever: give a corpus jsonl") and "\n" not in err
    assert main(["index", "--corpus", str(tmp_path / "missing.jsonl"), "--index_dir", str(tmp_path / "i")]) == 2
    assert "file not found" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "i")


def _client(index, **caps):
    from fastapi.testclient import TestClient

    return TestClient(create_app(index, **caps), raise_server_exceptions=False)


def _post_raw(client, body):
    return client.post("/retrieve", content=body, headers={"content-type": "application/json"})


@pytest.mark.parametrize(
    "body",
    [
        b'{"queries": ["\\ud800 lone-surrogate"]}',  # JSON escape of a lone surrogate: not UTF-8 text
        b'{"queries": ["France", "a\\udfffb lone-surrogate"], "topk": 2}',
        b'{"queries": ["lone-surrogate"], "topk": "lone-surrogate\\ud800"}',
    ],
)
def test_a_lone_surrogate_is_422_not_500(index, body):
    resp = _post_raw(_client(index), body)
    assert resp.status_code == 422, resp.text
    assert "lone-surrogate" not in resp.text and "ud800" not in resp.text.lower()
    assert all(set(error) == {"type", "loc", "msg"} for error in resp.json()["detail"])


def test_a_422_never_echoes_the_input(index):
    client = _client(index)
    for payload in (
        {"queries": ["secret-words " * 200]},  # over MAX_QUERY_CHARS
        {"queries": ["France"], "topk": "secret-words"},
        {"queries": "secret-words"},
        {"queries": [{"secret-words": 1}]},
    ):
        resp = client.post("/retrieve", json=payload)
        assert resp.status_code == 422 and "secret-words" not in resp.text, resp.text
        assert resp.json()["detail"][0]["loc"][0] == "body"


def test_a_body_over_the_cap_is_413_unread(index):
    client = _client(index)
    query = "x" * MAX_QUERY_CHARS
    big = json.dumps({"queries": [query] * (30 * (1 << 20) // len(query))}).encode()  # ~30 MB
    resp = _post_raw(client, big)
    assert resp.status_code == 413 and str(MAX_BODY_BYTES) in resp.json()["detail"]
    small = _client(index, max_body_bytes=100)
    body = json.dumps({"queries": ["France " * 20]}).encode()
    assert len(body) > 100 and _post_raw(small, body).status_code == 413
    # streamed without Content-Length (chunked): stopped at the cap too
    chunks = iter([body[:60], body[60:]])
    resp = small.post("/retrieve", content=chunks, headers={"content-type": "application/json"})
    assert resp.status_code == 413, resp.text
    ok = json.dumps({"queries": ["France"]}).encode()
    assert _post_raw(small, ok).status_code == 200
    assert small.post("/retrieve", content=iter([ok[:5], ok[5:]]), headers={"content-type": "application/json"}).json()


def test_cli_max_body_bytes_is_checked(corpus_path, capsys):
    assert main(["serve", "--corpus", corpus_path, "--max_body_bytes", "0"]) == 2
    assert capsys.readouterr().err.strip() == "hybridrl retriever: error: --max_body_bytes 0: must be at least 1 byte"
