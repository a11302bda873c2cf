"""The ``search`` tool: passages from a retriever, as verl's SearchTool (Search-R1 style).

Passages are shown as Search-R1 formats them (``Doc i(Title: ...) text``). A retriever that is
down, slow or broken gives an error response (``metrics["search_error"] = 1``), never a crash.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from hybridrl.agents.errors import AgentConfigError
from hybridrl.agents.retrieval import RetrieverError, format_passages, make_retriever, search_passages
from hybridrl.agents.tools.base import BaseTool, register_tool

__all__ = ["SearchTool"]


@register_tool("search")
class SearchTool(BaseTool):
    """``search({"query_list": [...]})`` -> the top passages of each query.

    ``config`` keys (verl's names where verl has one): ``retrieval_service_url`` (or ``url``),
    ``corpus_path`` / ``index_dir`` (in-process BM25), ``topk`` (3), ``timeout`` (seconds, 30).
    With none of url / corpus_path / index_dir the run's ``retriever`` section is used.

    Raises:
        AgentConfigError: ``topk`` < 1.
    """

    DEFAULT_SCHEMA = {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Searches the knowledge base for passages relevant to each query.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query_list": {
                        "type": "array",
                        "items": {"type": "string"},
                        "description": "one or more search queries",
                    }
                },
                "required": ["query_list"],
            },
        },
    }

    def __init__(self, config: dict | None = None, tool_schema=None) -> None:
        super().__init__(config, tool_schema)
        self.topk = int(self.config.get("topk", 3))
        if self.topk < 1:
            raise AgentConfigError(f"tool {self.name}: config.topk={self.topk}; ask for at least 1 passage")
        self._retriever = None
        self._default_retriever: Callable[[], object] | None = None

    def set_default_retriever(self, get_retriever: Callable[[], object]) -> None:
        """The run's retriever (``retriever`` section), used when the tool config names none."""
        self._default_retriever = get_retriever

    def _get_retriever(self):
        if self._retriever is None:
            cfg = self.config
            url = cfg.get("retrieval_service_url") or cfg.get("url")
            if url or cfg.get("corpus_path") or cfg.get("index_dir"):
                self._retriever = make_retriever(
                    url=url,
                    corpus_path=cfg.get("corpus_path"),
                    index_dir=cfg.get("index_dir"),
                    timeout_s=self.timeout_s,
                )
            elif self._default_retriever is not None:
                self._retriever = self._default_retriever()
            else:
                raise AgentConfigError(
                    f"tool {self.name}: no retriever; set retriever.url or retriever.corpus_path "
                    "(or url / corpus_path in the tool's config)"
                )
        return self._retriever

    async def execute(self, instance_id: str, parameters: dict, **kwargs) -> tuple[str, float, dict]:
        queries = parameters.get("query_list", parameters.get("query"))
        queries = [queries] if isinstance(queries, str) else list(queries or [])
        queries = [str(q) for q in queries if str(q).strip()]
        if not queries:
            return "Error: give at least one non-empty query in query_list", 0.0, {"error": 1}
        try:
            hits = await search_passages(self._get_retriever(), queries, self.topk, self.timeout_s)
        except asyncio.TimeoutError:
            return f"Error: the search engine did not answer within {self.timeout_s:g} s", 0.0, {"search_error": 1}
        except RetrieverError as exc:
            return f"Error: the search engine failed: {exc}", 0.0, {"search_error": 1}
        text = "\n".join(format_passages(h).strip() or "No results." for h in hits)
        return text, 0.0, {}
