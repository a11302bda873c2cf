"""BM25 index, retrievers and Search-R1's passage format."""

import http.server
import json
import os
import socket
import threading
import time

import pytest

from hybridrl.agents.retrieval import (
    BM25Index,
    HttpRetriever,
    InProcessRetriever,
    RetrieverError,
    format_passages,
    load_or_build_index,
    make_retriever,
    read_corpus,
)
from hybridrl.data.errors import DataError
from hybridrl.errors import ConfigError

WIKI_CORPUS = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "wiki", "corpus.jsonl")

DOCS = [
    {"id": "p0", "contents": '"Paris"\nParis is the capital and most populous city of France.'},
    {"id": "p1", "contents": '"Moon"\nThe Moon is Earth\'s only natural satellite.'},
    {
        "id": "p2",
        "contents": '"Python (programming language)"\nPython is a high-level programming language '
        "created by Guido van Rossum.",
    },
    {"id": "p3", "contents": '"Mount Everest"\nMount Everest is Earth\'s highest mountain above sea level.'},
    {"id": "p4", "contents": '"Jupiter"\nJupiter is the largest planet in the Solar System.'},
]


def write_corpus(path, docs):
    with open(path, "w", encoding="utf-8") as f:
        for doc in docs:
            f.write(json.dumps(doc) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def corpus_path(tmp_path_factory):
    return write_corpus(tmp_path_factory.mktemp("corpus") / "corpus.jsonl", DOCS)


@pytest.fixture(scope="module")
def index(corpus_path):
    return BM25Index.build(corpus_path)


def _ids(hits):
    return [hit["document"]["id"] for hit in hits]


def test_bm25_ranks_the_passage_with_the_query_words_first(index):
    results = index.search(
        [
            "who created the Python programming language",
            "highest mountain on Earth",
            "largest planet",
            "quantum chromodynamics",
        ],
        topk=3,
    )
    assert _ids(results[0])[0] == "p2"
    assert _ids(results[1])[0] == "p3"
    assert _ids(results[2]) == ["p4"]  # no other passage shares a word with "largest planet"
    assert results[3] == []  # nothing matches: no zero-score filler
    for hits in results:
        scores = [hit["score"] for hit in hits]
        assert scores == sorted(scores, reverse=True) and all(s > 0 for s in scores)
        assert all(set(hit) == {"document", "score"} and isinstance(hit["score"], float) for hit in hits)
    assert results[0][0]["document"] == DOCS[2]


def test_topk_bounds(index):
    # "earth" occurs in p1 and p3 only: asking for more than the corpus holds is fine
    assert sorted(_ids(index.search(["Earth"], topk=50)[0])) == ["p1", "p3"]
    assert len(index.search(["Earth"], topk=1)[0]) == 1
    assert index.search([], topk=3) == []
    with pytest.raises(ValueError, match="topk=0"):
        index.search(["Earth"], topk=0)


def test_save_load_round_trip_on_the_real_wiki_corpus(tmp_path):
    if not os.path.isfile(WIKI_CORPUS):
        pytest.skip(f"{WIKI_CORPUS} not found (real data lives in ../shared/data)")
    built = BM25Index.build(WIKI_CORPUS)
    assert len(built) == 12324
    built.save(str(tmp_path / "wiki_bm25"))
    loaded = BM25Index.load(str(tmp_path / "wiki_bm25"))
    queries = [
        "when was the last time anyone was on the moon",
        "who wrote hamlet",
        "capital of france",
        "largest planet in the solar system",
        "photosynthesis chlorophyll",
    ]
    assert loaded.search(queries, topk=5) == built.search(queries, topk=5)
    top = built.search(["moon landing apollo"], topk=3)[0]
    assert "moon landing" in top[0]["document"]["contents"].lower()
    assert os.listdir(tmp_path) == ["wiki_bm25"]  # no temp folders left behind


def test_save_replaces_an_existing_index(tmp_path, index):
    target = str(tmp_path / "idx")
    small = BM25Index.build(write_corpus(tmp_path / "small.jsonl", DOCS[:2]))
    small.save(target)
    index.save(target)
    assert len(BM25Index.load(target)) == 5
    assert sorted(os.listdir(tmp_path)) == ["idx", "small.jsonl"]


def test_load_or_build_reuses_the_index_and_rebuilds_for_another_corpus(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl", DOCS)
    index_dir = str(tmp_path / "idx")
    load_or_build_index(corpus, index_dir)
    meta = os.path.join(index_dir, "hybridrl_index.json")
    first_write = os.stat(meta).st_mtime_ns
    assert len(load_or_build_index(corpus, index_dir)) == 5
    assert os.stat(meta).st_mtime_ns == first_write  # loaded, not rebuilt
    assert len(load_or_build_index(None, index_dir)) == 5
    write_corpus(tmp_path / "c.jsonl", DOCS[:3])  # the corpus changed: the index must follow
    assert len(load_or_build_index(corpus, index_dir)) == 3
    assert len(BM25Index.load(index_dir)) == 3


def test_format_passages_exact_string():
    hits = [
        {"document": {"id": "1", "contents": '"Moon"\nThe Moon orbits Earth.\nIt has phases.'}, "score": 2.5},
        {"document": {"id": "2", "contents": "No title line"}, "score": 1.0},
    ]
    assert format_passages(hits) == (
        'Doc 1(Title: "Moon") The Moon orbits Earth.\nIt has phases.\nDoc 2(Title: No title line) \n'
    )
    assert format_passages([]) == ""


def test_bad_corpus_and_index_files(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "0", "contents": "ok"}\n{"id": 1}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: expected an object with 'id' and a string 'contents'"):
        read_corpus(str(bad))
    bad.write_text("{not json\n")
    with pytest.raises(DataError, match=r"bad.jsonl:1: not valid JSON"):
        read_corpus(str(bad))
    bad.write_text("\n")
    with pytest.raises(DataError, match="no passages"):
        read_corpus(str(bad))
    with pytest.raises(DataError, match="file not found"):
        BM25Index.build(str(tmp_path / "missing.jsonl"))
    with pytest.raises(DataError, match="no BM25 index there"):
        BM25Index.load(str(tmp_path))
    assert read_corpus(write_corpus(tmp_path / "ids.jsonl", [{"id": 7, "contents": "x"}])) == [
        {"id": "7", "contents": "x"}
    ]


def test_make_retriever_choices(corpus_path, tmp_path):
    assert isinstance(make_retriever(url="http://127.0.0.1:1/retrieve"), HttpRetriever)
    in_proc = make_retriever(corpus_path=corpus_path)
    assert isinstance(in_proc, InProcessRetriever)
    assert _ids(in_proc.retrieve(["largest planet"], 2)[0]) == ["p4"]
    with pytest.raises(ConfigError, match="retriever: set a server url"):
        make_retriever()
    with pytest.raises(ConfigError, match="full http"):
        make_retriever(url="127.0.0.1:8000/retrieve")
    with pytest.raises(DataError, match="no BM25 index there"):
        make_retriever(index_dir=str(tmp_path / "nothing"))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_http_retriever_nothing_listening():
    url = f"http://127.0.0.1:{_free_port()}/retrieve"
    with pytest.raises(RetrieverError, match=f"retriever {url} is not reachable"):
        HttpRetriever(url, timeout_s=5.0).retrieve(["moon"], 3)


class _Handler(http.server.BaseHTTPRequestHandler):
    """Misbehaving servers, one per path."""

    def do_POST(self):  # http.server's name
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/slow":
            time.sleep(1.5)
        status, body = {"/error": (500, b"boom"), "/garbage": (200, b"<html>"), "/short": (200, b'{"result": []}')}.get(
            self.path, (200, b'{"result": [[]]}')
        )
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except OSError:  # the client gave up (timeout test)
            pass

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def bad_server():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def test_http_retriever_times_out(bad_server):
    with pytest.raises(RetrieverError, match=r"did not answer within 0.3 s"):
        HttpRetriever(bad_server + "/slow", timeout_s=0.3).retrieve(["moon"], 3)


@pytest.mark.parametrize(
    "path, message", [("/error", "answered HTTP 500"), ("/garbage", "malformed answer"), ("/short", "malformed answer")]
)
def test_http_retriever_bad_answers(bad_server, path, message):
    with pytest.raises(RetrieverError, match=message) as info:
        HttpRetriever(bad_server + path, timeout_s=5.0).retrieve(["moon"], 3)
    assert bad_server + path in str(info.value) and "\n" not in str(info.value)


def test_http_retriever_empty_result_is_fine(bad_server):
    assert HttpRetriever(bad_server + "/ok", timeout_s=5.0).retrieve(["moon"], 3) == [[]]
    assert HttpRetriever(bad_server + "/ok").retrieve([], 3) == []
