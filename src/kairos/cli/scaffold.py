"""`kairos init`: write a small project that works as it is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from kairos.errors import KairosError

FILES = {
    "kairos.yaml": """\
# kairos project settings; see the README for every option.
sources:
  app: sqlite:///data/app.db
online_store: memory://
query_log: sqlite:///.kairos/query_log.db
server:
  host: 127.0.0.1
  port: 8000
""",
    "features.py": """\
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
    with sqlite3.connect(root / "data" / "app.db") as db:
        db.execute(
            "create table users (id text primary key, name text, credit_limit real, spent real)"
        )
        db.executemany("insert into users values (?, ?, ?, ?)", ROWS)
    print(f"created a kairos project in {root}; try:")
    print(f"  kairos query --project {root} --in user.id=u1 --out user.available --out user.name")
    print(f"  kairos serve {root}")
    return 0
