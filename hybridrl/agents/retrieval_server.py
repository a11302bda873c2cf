"""``hybridrl retriever``: a BM25 retrieval server with Search-R1's wire format, and its index.

    hybridrl retriever index --corpus corpus.jsonl --index_dir ~/data/wiki_bm25
    hybridrl retriever serve --corpus corpus.jsonl --index_dir ~/data/wiki_bm25 --port 8000

``POST /retrieve`` takes ``{"queries": [...], "topk": k, "return_scores": bool}`` and answers
``{"result": [[{"document": {"id", "contents"}, "score"}, ...], ...]}``; without
``return_scores`` each query gets a plain list of documents, as Search-R1's server returns
("Search-R1", Jin et al., arXiv:2503.09516). ``GET /health`` says whether it is up.
"""

# No `from __future__ import annotations`: FastAPI must resolve the request model defined in create_app.
import argparse
import logging
import sys
import time

from hybridrl.agents.retrieval import BM25Index, RetrieverError, load_or_build_index
from hybridrl.data.errors import DataError
from hybridrl.errors import ConfigError

__all__ = ["create_app", "main"]

logger = logging.getLogger(__name__)


# Request caps: a request beyond them gets 422 before any search (a 753-byte request once
# asked for a 33.5 MB answer, one 10 MB query took 18 s of CPU).
MAX_TOPK = 50
MAX_QUERIES = 256
MAX_QUERY_CHARS = 2048
# A body beyond this gets 413 before it is read whole or parsed (a 30 MB body was once parsed
# and echoed back in a 422). The caps above fit in it: 256 ASCII queries of 2048 characters.
MAX_BODY_BYTES = 1 << 20


def _body_limit(app, max_body_bytes: int):
    """ASGI middleware: 413 for an HTTP request whose body is larger than ``max_body_bytes``,
    declared (Content-Length) or streamed (chunked): the reading stops at the cap."""
    from fastapi import HTTPException
    from fastapi.responses import JSONResponse

    detail = f"request body larger than {max_body_bytes} bytes; send fewer or shorter queries"

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        length = dict(scope.get("headers") or []).get(b"content-length", b"0")
        if not length.isdigit() or int(length) > max_body_bytes:
            return await JSONResponse({"detail": detail}, status_code=413)(scope, receive, send)
        received = 0

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_body_bytes:  # FastAPI answers an HTTPException raised here as is
                    raise HTTPException(status_code=413, detail=detail)
            return message

        return await app(scope, limited_receive, send)

    return middleware


def create_app(
    index: BM25Index,
    default_topk: int = 3,
    max_topk: int = MAX_TOPK,
    max_queries: int = MAX_QUERIES,
    max_query_chars: int = MAX_QUERY_CHARS,
    max_body_bytes: int = MAX_BODY_BYTES,
):
    """A FastAPI app that serves ``index``.

    Args:
        index: the BM25 index to search.
        default_topk: passages per query when a request gives no ``topk``.
        max_topk, max_queries, max_query_chars: the largest ``topk``, number of queries and
            query length (characters) a request may ask for; beyond them it gets HTTP 422.
            A 422 says where and what is wrong, never the input (which may not be encodable).
        max_body_bytes: the largest request body; a larger one gets HTTP 413 unread.

    Raises:
        RetrieverError: FastAPI is not installed.
    """
    try:
        from typing import Annotated

        from fastapi import FastAPI, Request
        from fastapi.exceptions import RequestValidationError
        from fastapi.responses import JSONResponse
        from pydantic import BaseModel, Field
    except ImportError:
        raise RetrieverError("the retrieval server needs fastapi and uvicorn: pip install 'hybridrl[agents]'") from None

    class QueryRequest(BaseModel):
        queries: list[Annotated[str, Field(max_length=max_query_chars)]] = Field(max_length=max_queries)
        topk: int | None = Field(default=None, ge=1, le=max_topk)
        return_scores: bool = False

    app = FastAPI(title="hybridrl BM25 retriever")
    app.add_middleware(_body_limit, max_body_bytes=max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        # FastAPI's default echoes the input: a lone surrogate then fails to encode (500), and
        # a huge query comes back whole. Only where (loc) and what (type, msg) are answered.
        errors = [
            {
                "type": str(error.get("type", "")),
                "loc": [part if isinstance(part, int) else _printable(part) for part in error.get("loc", ())],
                "msg": _printable(error.get("msg", "")),
            }
            for error in exc.errors()
        ]
        return JSONResponse({"detail": errors}, status_code=422)

    # Plain `def` endpoints run in FastAPI's thread pool, so a long batch does not block /health.
    @app.post("/retrieve")
    def retrieve(request: QueryRequest) -> dict:
        hits = index.search(request.queries, request.topk or default_topk)
        if request.return_scores:
            return {"result": hits}
        return {"result": [[hit["document"] for hit in row] for row in hits]}

    @app.get("/health")
    def health() -> dict:
        return {"status": "ok", "num_docs": len(index)}

    return app


def _printable(value) -> str:
    """``str(value)`` with what UTF-8 cannot encode (lone surrogates) escaped, cut at 200 characters."""
    return str(value)[:200].encode("utf-8", "backslashreplace").decode("utf-8")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hybridrl retriever", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="action", required=True)
    index = sub.add_parser("index", help="build the BM25 index of a corpus and save it")
    index.add_argument("--corpus", required=True, help='jsonl with one {"id", "contents"} passage per line')
    index.add_argument("--index_dir", required=True, help="folder to write the index to (replaced atomically)")
    serve = sub.add_parser("serve", help="serve POST /retrieve (Search-R1's format)")
    serve.add_argument("--corpus", default=None, help='jsonl with one {"id", "contents"} passage per line')
    serve.add_argument(
        "--index_dir", default=None, help="saved index: loaded when it matches the corpus, else built and saved there"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument("--topk", type=int, default=3, help="passages per query when a request gives no topk")
    serve.add_argument(
        "--max_body_bytes",
        type=int,
        default=MAX_BODY_BYTES,
        help=f"largest request body in bytes; a larger one gets HTTP 413 (default {MAX_BODY_BYTES})",
    )
    return parser


def _serve(args: argparse.Namespace) -> None:
    try:
        import uvicorn
    except ImportError:
        raise RetrieverError("the retrieval server needs fastapi and uvicorn: pip install 'hybridrl[agents]'") from None
    if not 1 <= args.topk <= MAX_TOPK:
        raise ConfigError(f"--topk {args.topk}: must be between 1 and {MAX_TOPK}")
    if args.max_body_bytes < 1:
        raise ConfigError(f"--max_body_bytes {args.max_body_bytes}: must be at least 1 byte")
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port {args.port}: not a TCP port (0-65535; 0 picks a free one)")
    start = time.perf_counter()
    index = load_or_build_index(args.corpus, args.index_dir)
    print(
        f"BM25 index ready: {len(index)} passages in {time.perf_counter() - start:.1f} s; "
        f"serving http://{args.host}:{args.port}/retrieve",
        flush=True,
    )
    app = create_app(index, args.topk, max_body_bytes=args.max_body_bytes)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


def main(argv: list[str] | None = None) -> int:
    """``hybridrl retriever index|serve ...``; returns the exit status (2 with one line on bad input)."""
    args = build_parser().parse_args(argv)
    try:
        if args.action == "index":
            start = time.perf_counter()
            index = BM25Index.build(args.corpus)
            index.save(args.index_dir)
            print(f"indexed {len(index)} passages in {time.perf_counter() - start:.1f} s -> {args.index_dir}")
        else:
            _serve(args)
    except (ConfigError, DataError, RetrieverError) as exc:
        print(f"hybridrl retriever: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
