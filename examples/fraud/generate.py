"""Write the fraud example's SQLite file: seeded, so every run makes the same data.

python -m examples.fraud.generate [--users 200] [--seed 7]
"""

import argparse
import fcntl
import filecmp
import os
import random
import shutil
import sqlite3
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path

from .resolvers import DB_PATH

# The example's "now": the data is laid out around it, and the demo queries at it.
ANCHOR = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
MERCHANTS = ("grocer", "fuel", "airline", "electronics", "cafe", "pharmacy", "online-market")


def generate(path: Path = DB_PATH, users: int = 200, seed: int = 7) -> Path:
    """Create (or replace) the database at `path` and return the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # processes generating at once (test workers, `make demo`) take turns: one trains the model
    with path.with_name(path.name + ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        with tempfile.TemporaryDirectory() as scratch:
            made = _write(Path(scratch) / path.name, users, seed)
            # seeded, so mostly the very bytes already there: then the folder is left as it is,
            # under a server reading it or a copy being taken of it
            if not (path.exists() and filecmp.cmp(made, path, shallow=False)):
                fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
                os.close(fd)
                shutil.copyfile(made, tmp)
                os.replace(tmp, path)
        if path.resolve() == DB_PATH.resolve():
            from .train import ensure_model

            ensure_model(users=users, seed=seed)  # `User.risk` is served by the trained model
    return path


def _write(path: Path, users: int, seed: int) -> Path:
    """A new database at `path` (a file not there yet)."""
    rng = random.Random(seed)
    db = sqlite3.connect(path)
    try:
        db.executescript(
            """
            create table users (id text primary key, name text, email text, signup_at text);
            create table transactions (
                id text primary key, user_id text references users(id), amount real,
                status text, merchant text, ts text
            );
            create index transactions_by_user on transactions (user_id, ts);
            """
        )
        txn = 0
        for index in range(1, users + 1):
            uid = f"u{index:04d}"
            signup = ANCHOR - timedelta(days=rng.randint(3, 1500), seconds=rng.randint(0, 86399))
            db.execute(
                "insert into users values (?, ?, ?, ?)",
                (uid, f"User {index}", f"user{index}@example.com", signup.isoformat()),
            )
            decline_rate = rng.choice((0.02, 0.05, 0.1, 0.3))
            ticket = rng.choice((15.0, 40.0, 120.0))
            # Some users are on a spree: many transactions in the last day.
            spree = rng.random() < 0.1
            count = rng.randint(0, 60)
            times = [ANCHOR - timedelta(seconds=rng.randint(0, 120 * 86400)) for _ in range(count)]
            if spree:
                times += [ANCHOR - timedelta(seconds=rng.randint(0, 86400)) for _ in range(12)]
            # A few rows after ANCHOR: a query at ANCHOR must never see them.
            times += [ANCHOR + timedelta(seconds=rng.randint(1, 5 * 86400)) for _ in range(2)]
            for ts in times:
                txn += 1
                status = "declined" if rng.random() < decline_rate else "approved"
                amount = round(rng.lognormvariate(0, 0.8) * ticket, 2)
                db.execute(
                    "insert into transactions values (?, ?, ?, ?, ?, ?)",
                    (f"t{txn:07d}", uid, amount, status, rng.choice(MERCHANTS), ts.isoformat()),
                )
        db.commit()
    finally:
        db.close()
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    path = generate(users=args.users, seed=args.seed)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
