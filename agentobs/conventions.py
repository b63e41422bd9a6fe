"""Span conventions: every attribute alias list agentobs reads, in one place, for both backends.

The DuckDB store resolves them while decoding (agentobs/collect/normalize.py: typed columns of ``spans``); ClickHouse
resolves the same lists in the materialized views ``agentobs clickhouse init`` creates
(agentobs/backends/clickhouse/model.py). The first four are the defaults of settings (``session_keys``,
``task_keys``, ``task_type_keys``, ``tenant_keys``: agentobs/config.py), so a deployment can extend them; the rest
are fixed. docs/span-conventions.md explains each.
"""

from __future__ import annotations

# -- identity (defaults of the settings of the same name, lower-case) ------------------------------------------
SESSION_KEYS = [
    "gen_ai.conversation.id",
    "session.id",
    "langfuse.session.id",
    "traceloop.association.properties.session_id",
    "metadata.session_id",
    "litellm_session_id",
    "litellm.session_id",
    "gen_ai.session.id",
    "http.request.header.x-session-id",
    "http.request.header.agent-session-id",
    "http.request.header.x-claude-code-session-id",
    "http.request.header.x-litellm-session-id",
    "http.request.header.session-id",
]

TASK_KEYS = ["app.task.id", "agentobs.task.id", "gen_ai.task.id", "traceloop.workflow.name"]
TASK_TYPE_KEYS = ["agentobs.task.type", "app.task.type", "gen_ai.agent.name"]
TENANT_KEYS = [
    "agentobs.tenant",
    "enduser.id",
    "user.id",
    "litellm.team.alias",
    "litellm.team.id",
    "metadata.user_api_key_team_alias",
    "metadata.user_api_key_team_id",
    "metadata.user_api_key_user_id",
    "litellm.metadata.user_api_key_user_id",
]

# -- the call ----------------------------------------------------------------------------------------------------
ATTEMPT_KEYS = ("agentobs.attempt", "gen_ai.request.attempt")
MODEL_KEYS = ("gen_ai.response.model", "gen_ai.request.model", "llm.request.model")
PROVIDER_KEYS = ("gen_ai.provider.name", "gen_ai.system")
ADDR_KEYS = ("server.address", "agentobs.instance")

INPUT_KEYS = (
    "gen_ai.usage.input_tokens",
    "gen_ai.usage.prompt_tokens",
    "llm.usage.prompt_tokens",
    "llm.token_count.prompt",
)
CACHED_KEYS = (
    "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.cache_read_input_tokens",
    "gen_ai.usage.prompt_tokens_details.cached_tokens",
    "llm.token_count.prompt_details.cache_read",
    "gen_ai.usage.text.cache_read.input_tokens",
)
CACHE_WRITE_KEYS = (
    "gen_ai.usage.cache_write.input_tokens",
    "gen_ai.usage.cache_creation.input_tokens",
    "gen_ai.usage.cache_creation_input_tokens",
)
OUTPUT_KEYS = (
    "gen_ai.usage.output_tokens",
    "gen_ai.usage.completion_tokens",
    "llm.usage.completion_tokens",
    "llm.token_count.completion",
)
TTFT_KEYS = (
    "gen_ai.response.time_to_first_chunk",
    "gen_ai.latency.time_to_first_token",
    "gen_ai.server.time_to_first_token",
)
# input tokens that exclude cache reads/writes (Anthropic's own API usage): only where the span says so, never
# inferred from gen_ai.provider.name (GenAI semconv: gen_ai.usage.input_tokens includes cached tokens, for Anthropic
# too; docs/span-conventions.md lists what was checked). The flag may sit on the span or its resource.
INPUT_EXCLUDES_CACHE = "agentobs.usage.input_excludes_cache"
# whether the call was streamed: on a call that was not, a gateway's "time to first chunk" is the whole latency
STREAM_KEYS = ("gen_ai.request.stream", "llm.is_streaming", "gen_ai.is_streaming", "litellm.request.streaming")
# an HTTP error status on the span (stable semconv name, then the pre-1.21 one)
HTTP_STATUS_KEYS = ("http.response.status_code", "http.status_code")
