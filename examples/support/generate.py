"""Write the support example's SQLite file: accounts and their charges, seeded, so every run
makes the same data.

python -m examples.support.generate [--accounts 50] [--seed 11]
"""

import argparse
import os
import random
import sqlite3
import tempfile
from datetime import timedelta
from pathlib import Path

from .corpus import ANCHOR

DB_PATH = Path(__file__).parent / "data" / "support.db"
PLANS = ("free", "team", "business")
LANGS = ("en", "en", "en", "de", "fr")


def generate(path: Path = DB_PATH, accounts: int = 50, seed: int = 11) -> Path:
    """Create (or replace) the database at `path` and return the path."""
    rng = random.Random(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    os.close(fd)
    db = sqlite3.connect(tmp)
    try:
        db.executescript(
            """
            create table accounts (
                id text primary key, name text, plan text, lang text, signup_at text
            );
            create table charges (
                id text primary key, account_id text references accounts(id), amount real,
                status text, refunded integer, ts text
            );
            create index charges_by_account on charges (account_id, ts);
            """
        )
        charge = 0
        for index in range(1, accounts + 1):
            aid = f"a{index:03d}"
            plan = PLANS[index % len(PLANS)]
            signup = ANCHOR - timedelta(days=rng.randint(20, 900))
            db.execute(
                "insert into accounts values (?, ?, ?, ?, ?)",
                (aid, f"Customer {index}", plan, LANGS[index % len(LANGS)], signup.isoformat()),
            )
            price = {"free": 0.0, "team": 49.0, "business": 299.0}[plan]
            failing = rng.random() < 0.2
            for day in range(0, min(180, (ANCHOR - signup).days), 30):
                charge += 1
                status = "failed" if failing and day < 60 and rng.random() < 0.6 else "paid"
                refunded = int(status == "paid" and rng.random() < 0.15)
                ts = ANCHOR - timedelta(days=day, hours=rng.randint(0, 23))
                db.execute(
                    "insert into charges values (?, ?, ?, ?, ?, ?)",
                    (f"c{charge:06d}", aid, price, status, refunded, ts.isoformat()),
                )
        db.commit()
    finally:
        db.close()
    os.replace(tmp, path)
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--accounts", type=int, default=50)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args()
    print(f"wrote {generate(accounts=args.accounts, seed=args.seed)}")


if __name__ == "__main__":
    main()
