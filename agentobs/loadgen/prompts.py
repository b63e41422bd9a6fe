"""Prompts synthesised from a workload's block ids, so that two calls share a prefix exactly when their block
chains do.

A trace block (64 tokens in the kv-cache-tester traces, 512 in Mooncake's, split into 64-token sub-blocks by the
loaders) becomes ``tokens_per_block`` words, each word one token of the target's tokenizer. The words of a block
are a pure function of its id (ids are prefix-chained: equal id ⇒ equal prefix), so equal chains give equal text
and a different id gives different text from that block on. The prompt's tail beyond its full blocks is words
unique to the call (the trace does not say the tail is shared). One user message carries the text; the chat
template's own tokens (measured once on the target) are taken off the content so that the prompt the engine
counts is the trace's size.

Tokenizers, best first: the target's ``/tokenize`` endpoint (vLLM, SGLang), a local ``tokenizer.json``
(``--tokenizer``, needs the ``tokenizers`` package), or none (one word taken as one token, unchecked). The
achieved sizes are checked against the engine's ``usage.prompt_tokens`` per call after the run either way.
"""

from __future__ import annotations

import http.client
import io
import json
import urllib.error
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..errors import ConfigError
from ..sim.chain import Chain

# Candidate words: common English words (one token in the usual BPE vocabularies) and the words the repository's
# tiny test model was trained on; each is kept only when the target's tokenizer makes " word" a single token.
CANDIDATES = tuple(dict.fromkeys((
    "the agent calls a tool and reads the result then plans the next step with context from previous turns user "
    "assistant system function file search query cache block token request session trace span metric latency "
    "prefix evict memory model server error retry status ok json value list number name path line code test build "
    "run time year people way day man thing woman life child world school state family student group country "
    "problem hand part place case week company point government work home water room mother area money story "
    "fact month lot right study book eye job word business issue side kind head house service friend father power "
    "hour game end member law car city community president team minute idea kid body information back parent face "
    "others level office door health person art war history party morning reason research girl guy moment air "
    "teacher force education foot boy age policy process music market sense nation plan college interest death "
    "experience effect use class control care field development role effort rate heart drug show leader light "
    "voice wife police mind price report decision son view relationship town road arm difference thanks value "
    "building action model season society tax director position player record paper space ground form event "
    "official matter center couple site project activity star table need court oil situation cost industry figure "
    "street image phone data picture practice piece land product doctor wall patient worker news test movie north "
    "love support technology step baby computer type attention film tree source organization hair window evidence "
    "population site rule page account gas table green blue red black white big small good new old high long"
).split()))


class Tokenizer:
    """Counts tokens of plain text (no special tokens) and of a chat prompt as the engine renders it."""

    name = "none"
    checked = False

    def count(self, text: str) -> int:
        return len(text.split())

    def chat_count(self, messages: list[dict]) -> int | None:
        return None


class RemoteTokenizer(Tokenizer):
    """The target's ``POST /tokenize`` (vLLM and SGLang): ``{"model", "prompt"}`` or ``{"model", "messages"}``."""

    name = "target /tokenize"
    checked = True

    def __init__(self, base: str, model: str, headers: dict[str, str], timeout_s: float = 30.0):
        self.base, self.model, self.headers, self.timeout_s = base, model, headers, timeout_s
        u = urlsplit(base)
        if not u.hostname:
            raise ConfigError(f"tokenizer URL {base!r} names no host")
        self._host, self._port, self._path = u.hostname, u.port or 80, u.path.rstrip("/") + "/tokenize"
        self._conn: http.client.HTTPConnection | None = None

    def _post(self, body: dict) -> dict:
        """One request on a kept-alive connection (the vocabulary check sends a few hundred)."""
        data = json.dumps(body).encode()
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s)
            try:
                self._conn.request("POST", self._path, body=data,
                                   headers={"Content-Type": "application/json", **self.headers})
                r = self._conn.getresponse()
                payload = r.read()
            except (OSError, http.client.HTTPException):
                self._conn.close()
                self._conn = None
                if attempt:
                    raise
                continue
            if r.status != 200:
                raise urllib.error.HTTPError(self.base + "/tokenize", r.status, r.reason, r.headers,
                                             io.BytesIO(payload))
            return json.loads(payload)
        raise OSError("unreachable")

    def count(self, text: str) -> int:
        return int(self._post({"model": self.model, "prompt": text, "add_special_tokens": False})["count"])

    def chat_count(self, messages: list[dict]) -> int | None:
        return int(self._post({"model": self.model, "messages": messages, "add_generation_prompt": True})["count"])

    @classmethod
    def probe(cls, base: str, model: str, headers: dict[str, str]) -> RemoteTokenizer | None:
        """The target's tokenizer, or None when it has no ``/tokenize`` (404/405 or not JSON)."""
        t = cls(base, model, headers)
        try:
            n = t.count(" test")
        except urllib.error.HTTPError as e:
            if e.code in (404, 405, 501):
                return None
            raise ConfigError(f"{base}/tokenize answered HTTP {e.code}: {e.read()[:200]!r}") from e
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return t if n >= 1 else None


class LocalTokenizer(Tokenizer):
    """A Hugging Face ``tokenizer.json`` read with the ``tokenizers`` package (no chat template: overhead 0)."""

    name = "local tokenizer.json"
    checked = True

    def __init__(self, path: str):
        try:
            from tokenizers import Tokenizer as HfTokenizer
        except ImportError:
            raise ConfigError("--tokenizer needs the 'tokenizers' package (pip install tokenizers)") from None
        try:
            self.tok = HfTokenizer.from_file(path)
        except Exception as e:  # noqa: BLE001 - the library raises plain Exceptions for a bad file
            raise ConfigError(f"--tokenizer {path}: cannot load ({e})") from e
        self.name = f"local {path}"

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)


@dataclass
class Vocabulary:
    words: tuple[str, ...]      # each " word": one token, and a run of them is one token per word
    chat_overhead: int          # tokens the chat template adds around one user message
    tokenizer: str
    checked: bool


def vocabulary(tok: Tokenizer, min_words: int = 32) -> Vocabulary:
    """The candidate words the tokenizer keeps as one token each (checked together too), and the chat template's
    overhead measured on a 50-word message."""
    if not tok.checked:
        return Vocabulary(tuple(" " + w for w in CANDIDATES), 0, tok.name, False)
    words = [" " + w for w in CANDIDATES if tok.count(" " + w) == 1]
    if len(words) < min_words:
        raise ConfigError(f"the target's tokenizer keeps only {len(words)} of {len(CANDIDATES)} common words as one "
                          f"token (need {min_words}); give a --tokenizer")
    joined = "".join(words)
    if tok.count(joined) != len(words):  # merges across words: keep a prefix that does not merge
        raise ConfigError(f"the tokenizer ({tok.name}) merges tokens across words: {tok.count(joined)} tokens for "
                          f"{len(words)} one-token words; prompts cannot be sized exactly")
    probe = "".join(words[:50])
    n = tok.chat_count([{"role": "user", "content": probe}])
    overhead = 0 if n is None else n - 50
    if overhead < 0:
        raise ConfigError(f"the chat template's overhead came out negative ({overhead}); cannot size prompts")
    return Vocabulary(tuple(words), overhead, tok.name, True)


_MASK = (1 << 64) - 1


class PromptBuilder:
    """Text of ``n`` tokens for a chain of block ids, ``tokens_per_block`` words per block."""

    def __init__(self, vocab: Vocabulary, tokens_per_block: int):
        if tokens_per_block < 1:
            raise ConfigError(f"tokens per block must be ≥ 1, got {tokens_per_block}")
        self.vocab = vocab
        self.words = vocab.words
        self.b = tokens_per_block
        self._blocks: dict[int, str] = {}
        self._runs: dict[tuple[int, int], str] = {}

    def _words(self, seed: int, n: int) -> list[str]:
        w, m = self.words, len(self.words)
        x = (seed * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019) & _MASK
        out = []
        for _ in range(n):
            x = (x * 6364136223846793005 + 1442695040888963407) & _MASK
            out.append(w[(x >> 33) % m])
        return out

    def block(self, block_id: int) -> str:
        s = self._blocks.get(block_id)
        if s is None:
            s = self._blocks[block_id] = "".join(self._words(block_id, self.b))
            if len(self._blocks) > 200_000:  # bounded: a long run's old blocks are rebuilt on demand
                self._blocks.clear()
                self._blocks[block_id] = s
        return s

    def run_text(self, a: int, b: int) -> str:
        """The words of blocks ``a … b-1`` (a run of consecutive ids), cached: the turns of a session repeat
        their chain's earlier runs."""
        key = (a, b)
        s = self._runs.get(key)
        if s is None:
            try:  # every block known: joined at C speed
                s = "".join(map(self._blocks.__getitem__, range(a, b)))
            except KeyError:
                s = "".join([self.block(i) for i in range(a, b)])
            if len(self._runs) > 50_000:
                self._runs.clear()
            self._runs[key] = s
        return s

    def content(self, chain: Chain | list[int], n_tokens: int, tail_seed: int, nblk: int | None = None) -> str:
        """``n_tokens`` words: the first ``nblk`` blocks of ``chain`` in order (the last one cut when they are
        more than ``n_tokens``), then words unique to ``tail_seed``."""
        b = self.b
        if not isinstance(chain, Chain):
            chain = Chain.from_ids(chain)
        n = len(chain) if nblk is None else min(nblk, len(chain))
        full = min(n, n_tokens // b)
        parts = [self.run_text(x, y) for x, y in chain.runs(0, full)]
        rest = n_tokens - full * b
        if rest and full < n:  # a partial block: a prefix of that block's own words
            cut = min(rest, b)
            parts.append("".join(self._words(chain.at(full), b)[:cut]))
            rest -= cut
        if rest:
            parts.append("".join(self._words(tail_seed ^ 0x5EED5EED5EED, rest)))
        return "".join(parts)
