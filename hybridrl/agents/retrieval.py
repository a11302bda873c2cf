"""Passage retrieval for search agents: a BM25 index, an in-process and an HTTP retriever.

The wire format and the passage text the model sees are those of Search-R1 ("Search-R1:
Training LLMs to Reason and Leverage Search Engines with Reinforcement Learning", Jin et al.,
arXiv:2503.09516), so a policy trained here can talk to a Search-R1 retrieval server and back.

A *hit* is ``{"document": {"id": str, "contents": str}, "score": float}``; ``contents`` is
``"\\"Title\\"\\ntext"`` as in Search-R1's (FlashRAG's) corpus files. Every retriever returns, per
query, up to ``topk`` hits, best first.

Light on import: ``bm25s`` and ``requests`` are imported when an index is built or a request is
sent, so the search tool can import :class:`RetrieverError` without them.
"""

from __future__ import annotations

import abc
import asyncio
import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from typing import Any

from hybridrl.data.errors import DataError
from hybridrl.data.jsonl import iter_jsonl
from hybridrl.errors import ConfigError, UserError

__all__ = [
    "RetrieverError",
    "Retriever",
    "BM25Index",
    "InProcessRetriever",
    "HttpRetriever",
    "make_retriever",
    "load_or_build_index",
    "read_corpus",
    "format_passages",
    "search_passages",
]

logger = logging.getLogger(__name__)

_META_FILE = "hybridrl_index.json"
_INDEX_FORMAT = 1
# One tokenizer for documents and queries; it is stored in the index metadata and checked on load.
_TOKENIZER = {"lower": True, "stopwords": "en", "stemmer": None}
_INSTALL_HINT = "pip install 'hybridrl[agents]'"


class RetrieverError(UserError, RuntimeError):
    """The retriever is down, too slow, answered badly, or cannot run here; one-line message."""


class Retriever(abc.ABC):
    """Anything that maps queries to ranked passages (the search tool's back end)."""

    @abc.abstractmethod
    def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Up to ``topk`` hits per query, best first: ``{"document": {"id", "contents"}, "score"}``.

        Raises:
            RetrieverError: the back end failed (down, timed out, malformed answer).
        """


def _require_bm25s():
    try:
        import bm25s
    except ImportError:
        raise RetrieverError(f"the BM25 retriever needs the `bm25s` package: {_INSTALL_HINT}") from None
    return bm25s


def read_corpus(corpus_path: str) -> list[dict]:
    """Read a retrieval corpus: one JSON object ``{"id", "contents"}`` per line.

    Returns:
        ``[{"id": str, "contents": str}, ...]`` in file order (ids are converted to ``str``).

    Raises:
        DataError: the file is missing or empty, a line is not JSON, or lacks ``id``/``contents``.
    """
    if not os.path.isfile(corpus_path):
        raise DataError(f'corpus {corpus_path}: file not found; pass a jsonl file of {{"id", "contents"}} rows')
    docs = []
    for lineno, row in iter_jsonl(corpus_path):
        if not isinstance(row, dict) or "id" not in row or not isinstance(row.get("contents"), str):
            raise DataError(
                f"{corpus_path}:{lineno}: expected an object with 'id' and a string 'contents' "
                "(Search-R1 corpus format: contents = '\"Title\"\\ntext')"
            )
        docs.append({"id": str(row["id"]), "contents": row["contents"]})
    if not docs:
        raise DataError(
            f'corpus {corpus_path}: no passages in the file; it needs one {{"id", "contents"}} row per line'
        )
    return docs


def corpus_fingerprint(corpus_path: str) -> str:
    """Cheap identity of a corpus file: its size and a hash of its first and last MiB.

    Enough to notice that a saved index belongs to another corpus without reading a 10 GB file.
    """
    size = os.path.getsize(corpus_path)
    digest = hashlib.blake2b(str(size).encode(), digest_size=16)
    with open(corpus_path, "rb") as f:
        digest.update(f.read(1 << 20))
        if size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            digest.update(f.read())
    return f"{size}:{digest.hexdigest()}"


def _tokenize(bm25s, texts: list[str], return_ids: bool):
    return bm25s.tokenize(
        texts, lower=_TOKENIZER["lower"], stopwords=_TOKENIZER["stopwords"], return_ids=return_ids, show_progress=False
    )


class BM25Index:
    """A BM25 index over a passage corpus, on ``bm25s`` (Lucene's BM25 variant, k1=1.5, b=0.75).

    Tokens are lower-cased words of two or more characters, English stop words removed, no
    stemming. Passages that share no word with a query are not returned (as with Lucene).
    """

    def __init__(self, model: Any, docs: list[dict], corpus_fingerprint: str | None = None):
        self._model = model
        self.docs = docs
        self.corpus_fingerprint = corpus_fingerprint

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def build(cls, corpus_path: str) -> BM25Index:
        """Index a corpus jsonl file (rows ``{"id", "contents"}``, see :func:`read_corpus`).

        Raises:
            DataError: unreadable corpus.
            RetrieverError: ``bm25s`` is not installed.
        """
        bm25s = _require_bm25s()
        docs = read_corpus(corpus_path)
        model = bm25s.BM25()
        model.index(_tokenize(bm25s, [d["contents"] for d in docs], return_ids=True), show_progress=False)
        return cls(model, docs, corpus_fingerprint(corpus_path))

    def save(self, index_dir: str) -> None:
        """Write the index to ``index_dir`` atomically (a temp dir beside it, then a rename).

        An index already there is replaced only once the new one is complete.
        """
        index_dir = os.path.abspath(index_dir)
        parent = os.path.dirname(index_dir)
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".bm25_tmp_", dir=parent)
        try:
            self._model.save(tmp, corpus=self.docs, show_progress=False)
            meta = {
                "format": _INDEX_FORMAT,
                "num_docs": len(self.docs),
                "tokenizer": _TOKENIZER,
                "corpus_fingerprint": self.corpus_fingerprint,
            }
            with open(os.path.join(tmp, _META_FILE), "w", encoding="utf-8") as f:
                json.dump(meta, f, indent=1)
            old = None
            if os.path.exists(index_dir):  # rename() cannot replace a non-empty folder: move it aside first
                old = tempfile.mkdtemp(prefix=".bm25_old_", dir=parent)
                os.replace(index_dir, os.path.join(old, "index"))
            os.replace(tmp, index_dir)
            if old is not None:
                shutil.rmtree(old, ignore_errors=True)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, index_dir: str) -> BM25Index:
        """Load an index written by :meth:`save`.

        Raises:
            DataError: ``index_dir`` holds no index of this format, or its files are damaged.
            RetrieverError: ``bm25s`` is not installed.
        """
        meta_path = os.path.join(index_dir, _META_FILE)
        hint = f"rebuild it with: hybridrl retriever index --corpus CORPUS.jsonl --index_dir {index_dir}"
        if not os.path.isfile(meta_path):
            raise DataError(f"index_dir {index_dir}: no BM25 index there ({_META_FILE} missing); {hint}")
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        if meta.get("format") != _INDEX_FORMAT or meta.get("tokenizer") != _TOKENIZER:
            raise DataError(
                f"index_dir {index_dir}: written by another hybridrl version (format {meta.get('format')}); {hint}"
            )
        bm25s = _require_bm25s()
        try:
            model = bm25s.BM25.load(index_dir, load_corpus=True, show_progress=False)
        except (OSError, ValueError) as exc:
            raise DataError(f"index_dir {index_dir}: damaged index ({type(exc).__name__}: {exc}); {hint}") from None
        docs = model.corpus
        model.corpus = None  # hits are built from self.docs; bm25s need not keep a second reference
        if docs is None or len(docs) != meta["num_docs"]:
            raise DataError(
                f"index_dir {index_dir}: corpus.jsonl has {0 if docs is None else len(docs)} passages, "
                f"the index {meta['num_docs']}; {hint}"
            )
        return cls(model, list(docs), meta.get("corpus_fingerprint"))

    def search(self, queries: list[str], topk: int) -> list[list[dict]]:
        """Rank the passages for each query with BM25.

        Args:
            queries: query strings.
            topk: the most hits to return per query (>= 1); fewer when fewer passages match.

        Returns:
            Per query, a list of ``{"document": {"id", "contents"}, "score": float}``, score
            descending; passages with score 0 (no shared word) are left out.

        Raises:
            ValueError: ``topk`` < 1.
        """
        if topk < 1:
            raise ValueError(f"topk={topk}: ask for at least 1 passage per query")
        if not queries:
            return []
        bm25s = _require_bm25s()
        tokens = _tokenize(bm25s, list(queries), return_ids=False)
        k = min(topk, len(self.docs))
        indices, scores = self._model.retrieve(tokens, k=k, show_progress=False, n_threads=0)
        results = []
        for row_idx, row_scores in zip(indices.tolist(), scores.tolist()):
            results.append(
                [{"document": dict(self.docs[i]), "score": float(s)} for i, s in zip(row_idx, row_scores) if s > 0]
            )
        return results


class InProcessRetriever(Retriever):
    """Search a :class:`BM25Index` held in this process (no server needed)."""

    def __init__(self, index: BM25Index):
        self.index = index

    def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        return self.index.search(queries, topk)


class HttpRetriever(Retriever):
    """Client of a Search-R1 style retrieval server (``hybridrl retriever serve`` or Search-R1's).

    Sends ``POST {url}`` with ``{"queries": [...], "topk": k, "return_scores": true}`` and
    expects ``{"result": [[{"document": {...,"contents"}, "score"}, ...], ...]}``.
    """

    def __init__(self, url: str, timeout_s: float = 10.0):
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ConfigError(
                f"retriever url={url!r}: give the full http(s) URL of the endpoint, e.g. http://127.0.0.1:8000/retrieve"
            )
        if not timeout_s > 0:
            raise ConfigError(f"retriever timeout_s={timeout_s}: must be > 0 seconds")
        self.url = url
        self.timeout_s = float(timeout_s)

    def retrieve(self, queries: list[str], topk: int) -> list[list[dict]]:
        """See :meth:`Retriever.retrieve`.

        Raises:
            RetrieverError: connection refused, no answer within ``timeout_s`` seconds, an HTTP
                status other than 200, or an answer that is not the expected JSON.
        """
        if not queries:
            return []
        try:
            import requests
        except ImportError:
            raise RetrieverError(f"HttpRetriever needs the `requests` package: {_INSTALL_HINT}") from None
        payload = {"queries": list(queries), "topk": int(topk), "return_scores": True}
        start_hint = "start it with `hybridrl retriever serve --corpus CORPUS.jsonl --port PORT` or fix the URL"
        try:
            resp = requests.post(self.url, json=payload, timeout=self.timeout_s)
        except requests.Timeout:
            raise RetrieverError(
                f"retriever {self.url} did not answer within {self.timeout_s:g} s; "
                "check the server's load or raise the timeout"
            ) from None
        except requests.RequestException as exc:
            raise RetrieverError(
                f"retriever {self.url} is not reachable ({type(exc).__name__}); {start_hint}"
            ) from None
        if resp.status_code != 200:
            raise RetrieverError(
                f"retriever {self.url} answered HTTP {resp.status_code}: "
                f"{resp.text[:200]!r}; check the URL (it must end in /retrieve) and the server log"
            )
        try:
            return _parse_hits(resp.json(), len(queries))
        except (ValueError, KeyError, TypeError) as exc:
            raise RetrieverError(
                f"retriever {self.url} sent a malformed answer ({exc}); it must follow "
                'Search-R1\'s format {"result": [[{"document", "score"}, ...], ...]}'
            ) from None


def _parse_hits(body: Any, n_queries: int) -> list[list[dict]]:
    """Check and normalise a server answer; raises ValueError/KeyError/TypeError when malformed."""
    result = body["result"]
    if not isinstance(result, list) or len(result) != n_queries:
        raise ValueError(f"'result' must be a list with one entry per query ({n_queries})")
    parsed = []
    for hits in result:
        row = []
        for hit in hits:
            doc = hit["document"]
            if not isinstance(doc.get("contents"), str):
                raise ValueError("a document has no string 'contents'")
            row.append(
                {"document": {"id": str(doc.get("id", "")), "contents": doc["contents"]}, "score": float(hit["score"])}
            )
        parsed.append(row)
    return parsed


def load_or_build_index(corpus_path: str | None = None, index_dir: str | None = None) -> BM25Index:
    """The BM25 index for a corpus: loaded from ``index_dir`` when it holds one for this corpus,
    else built from ``corpus_path`` (and saved to ``index_dir`` when given).

    A saved index whose corpus fingerprint differs from ``corpus_path`` is rebuilt.

    Raises:
        ConfigError: neither argument is given.
        DataError: unreadable corpus or index, or ``index_dir`` holds no index and no corpus is given.
    """
    if corpus_path is None and index_dir is None:
        raise ConfigError(
            "retriever: give a corpus jsonl (--corpus / corpus_path) or a saved index (--index_dir / index_dir)"
        )
    if index_dir is not None and os.path.isfile(os.path.join(index_dir, _META_FILE)):
        index = BM25Index.load(index_dir)
        if corpus_path is None or index.corpus_fingerprint == corpus_fingerprint(corpus_path):
            return index
        logger.warning("index %s was built from another corpus than %s; rebuilding it", index_dir, corpus_path)
    elif corpus_path is None:
        raise DataError(
            f"index_dir {index_dir}: no BM25 index there; build one with "
            f"hybridrl retriever index --corpus CORPUS.jsonl --index_dir {index_dir}, or pass a corpus too"
        )
    index = BM25Index.build(corpus_path)
    if index_dir is not None:
        index.save(index_dir)
    return index


def make_retriever(
    url: str | None = None, corpus_path: str | None = None, index_dir: str | None = None, timeout_s: float = 10.0
) -> Retriever:
    """The retriever a config asks for.

    ``url`` wins: an :class:`HttpRetriever`. Otherwise an :class:`InProcessRetriever` over the
    index in ``index_dir`` (loaded) or built from ``corpus_path`` in memory (and saved to
    ``index_dir`` when both are given; see :func:`load_or_build_index`).

    Raises:
        ConfigError: nothing to retrieve from, or a bad ``url``/``timeout_s``.
        DataError: unreadable corpus or index.
    """
    if url:
        return HttpRetriever(url, timeout_s=timeout_s)
    if corpus_path is None and index_dir is None:
        raise ConfigError(
            "retriever: set a server url (e.g. http://127.0.0.1:8000/retrieve), "
            "a corpus jsonl (corpus_path) or a saved BM25 index (index_dir)"
        )
    return InProcessRetriever(load_or_build_index(corpus_path, index_dir))


def format_passages(hits: list[dict]) -> str:
    """The text of the hits as Search-R1 shows it to the model (its ``_passages2string``).

    Each hit becomes ``f"Doc {i}(Title: {title}) {text}\\n"`` (``i`` from 1), where ``title`` is
    the first line of ``contents`` (quotes kept, as Search-R1 does) and ``text`` the rest.
    """
    out = []
    for i, hit in enumerate(hits, 1):
        title, _, text = hit["document"]["contents"].partition("\n")
        out.append(f"Doc {i}(Title: {title}) {text}\n")
    return "".join(out)


async def search_passages(retriever, queries: list[str], topk: int, timeout_s: float) -> list[list[dict]]:
    """``retriever.retrieve(queries, topk)`` in a daemon thread, bounded by ``timeout_s`` seconds.

    Not ``asyncio.to_thread``: ``asyncio.run`` waits for the default executor's threads when the
    batch's event loop closes, so one stuck retrieval would hold the whole step after its
    timeout. A daemon thread that overruns is left alone and nobody waits for it.

    Raises:
        RetrieverError: the retriever failed.
        asyncio.TimeoutError: no answer in time.
    """
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result=None, error=None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(result)

    def run() -> None:
        try:
            outcome = (retriever.retrieve(list(queries), int(topk)), None)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting coroutine
            outcome = (None, exc)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # the loop closed after the timeout: nobody waits for this answer
            pass

    threading.Thread(target=run, name="retriever", daemon=True).start()
    return await asyncio.wait_for(future, timeout_s)
